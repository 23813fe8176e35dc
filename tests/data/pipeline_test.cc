#include "cohort/data/pipeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "cohort/core/cuda.h"
#include "cohort/core/error.h"
#include "cohort/core/half.h"
#include "cohort/data/dicom.h"
#include "cohort/data/image.h"
#include "cohort/data/ops.h"
#include "cohort/data/scans.h"
#include "cohort/data/shards.h"

using namespace cohort::data;
namespace fs = std::filesystem;

namespace {

std::string make_set(const std::string& name, const std::string& format, int count) {
  std::string dir =
      (fs::temp_directory_path() / ("cohort-test-" + name + "-" + std::to_string(::getpid())))
          .string();
  fs::remove_all(dir);
  ScanSetOptions o;
  o.out = dir;
  o.count = count;
  o.format = format;
  o.width = 64;
  o.height = 48;
  o.seed = 11;
  make_scans(o);
  return dir;
}

// Evaluation (resize the shorter side, then a centre crop), batches of `batch`, one mean and
// deviation for every channel.
PipelineOptions eval_options(int batch, int size, int resize) {
  PipelineOptions o;
  o.batch = batch;
  o.size = size;
  o.train = false;
  o.resize = resize;
  o.mean = {0.5f};
  o.std = {0.25f};
  return o;
}

// (data set index -> hash of its output) over one epoch, and the batch sizes.
std::map<size_t, uint64_t> run(std::shared_ptr<const Source> s, PipelineOptions o, uint64_t epoch,
                               size_t from = 0, std::vector<size_t>* order = nullptr) {
  o.hash_samples = true;
  Pipeline p(s, o);
  p.start_epoch(epoch, from);
  std::map<size_t, uint64_t> out;
  Batch b;
  while (p.next(&b)) {
    for (int i = 0; i < b.size; ++i) {
      out[b.indices[static_cast<size_t>(i)]] = b.sample_hashes[static_cast<size_t>(i)];
      if (order) order->push_back(b.indices[static_cast<size_t>(i)]);
    }
  }
  return out;
}

}  // namespace

TEST(Pipeline, SameBytesWhateverTheThreadCount) {
  auto dir = make_set("threads", "jpeg", 40);
  auto samples = open_source(dir);
  PipelineOptions o;
  o.batch = 8;
  o.size = 32;
  o.seed = 5;
  o.workers = 1;
  std::vector<size_t> order1, order3;
  auto one = run(samples, o, 1, 0, &order1);
  o.workers = 3;
  o.prefetch = 1;
  auto three = run(samples, o, 1, 0, &order3);
  EXPECT_EQ(one, three);
  EXPECT_EQ(order1, order3);
  EXPECT_EQ(one.size(), 40u);
  auto other_epoch = run(samples, o, 2);
  EXPECT_NE(one, other_epoch);
  fs::remove_all(dir);
}

TEST(Pipeline, WorldSizesOneAndTwoProduceTheSameSamples) {
  auto dir = make_set("world", "png", 30);
  auto samples = open_source(dir);
  PipelineOptions o;
  o.batch = 4;
  o.size = 24;
  o.seed = 3;
  auto whole = run(samples, o, 0);
  o.world = 2;
  std::map<size_t, uint64_t> merged;
  for (int r = 0; r < 2; ++r) {
    o.rank = r;
    for (auto& [k, v] : run(samples, o, 0)) merged[k] = v;
  }
  EXPECT_EQ(whole, merged);
  fs::remove_all(dir);
}

TEST(Pipeline, ResumeMidEpochContinuesExactly) {
  auto dir = make_set("resume", "png", 25);
  auto samples = open_source(dir);
  PipelineOptions o;
  o.batch = 4;
  o.size = 16;
  std::vector<size_t> full, tail;
  auto a = run(samples, o, 3, 0, &full);
  auto b = run(samples, o, 3, 12, &tail);
  ASSERT_EQ(tail.size(), full.size() - 12);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), full.begin() + 12));
  for (auto& [k, v] : b) EXPECT_EQ(a.at(k), v);
  fs::remove_all(dir);
}

TEST(Pipeline, CorruptFilesAreSkippedAndCountedOrFailWhenAsked) {
  auto dir = make_set("corrupt", "jpeg", 12);
  auto list = scan_image_folder(dir, nullptr);
  // Truncate one file, empty another, replace a third with text.
  auto bytes = read_file(list[1].path);
  bytes.resize(bytes.size() / 3);
  write_file(list[1].path, bytes);
  write_file(list[4].path, {});
  write_file(list[7].path, std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o'});
  auto samples = file_source(list);
  PipelineOptions o;
  o.batch = 5;
  o.size = 16;
  o.shuffle = false;
  {
    Pipeline p(samples, o);
    p.start_epoch(0);
    Batch b;
    int images = 0;
    while (p.next(&b)) images += b.size;
    EXPECT_EQ(images, 9);
    EXPECT_EQ(p.stats().skipped, 3u);
  }
  o.fail_on_corrupt = true;
  Pipeline p(samples, o);
  p.start_epoch(0);
  Batch b;
  try {
    while (p.next(&b)) {
    }
    FAIL() << "no error with fail_on_corrupt";
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("scan_"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Pipeline, ShapesLayoutsAndGrayToThree) {
  auto dir = make_set("shape", "png", 6);
  auto samples = open_source(dir);
  PipelineOptions o = eval_options(4, 8, 10);
  o.channels = 3;
  Pipeline p(samples, o);
  p.start_epoch(0);
  Batch b;
  ASSERT_TRUE(p.next(&b));
  EXPECT_EQ(b.size, 4);
  EXPECT_EQ(b.channels, 3);
  EXPECT_EQ(b.bytes, 4u * 3 * 8 * 8 * 4);
  const float* f = reinterpret_cast<const float*>(b.data);
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(f[i], f[64 + i]);  // gray repeated
    EXPECT_GE(f[i], -2.0f - 1e-5);
    EXPECT_LE(f[i], 2.0f + 1e-5);
  }
  ASSERT_TRUE(p.next(&b));
  EXPECT_EQ(b.size, 2);  // the last batch is short
  EXPECT_FALSE(p.next(&b));
  fs::remove_all(dir);
}

// A DICOM scan's sample is its stored values windowed as decode_dicom windows the whole image,
// then that image's crop resized and normalised: the pipeline windows the crop's rows as the
// resampler reads them, and must give the same values (grayscale, and 8-bit colour).
TEST(Pipeline, DicomWindowedRowByRowEqualsTheWholeImageWindowed) {
  for (const bool colour : {false, true}) {
    auto dir = make_set(colour ? "dicom-rgb" : "dicom", "dicom", 4);
    struct Removed {  // also when an assertion ends the test early
      std::string dir;
      ~Removed() { fs::remove_all(dir); }
    } removed{dir};
    if (colour) {  // the same scans, written again as 8-bit RGB
      for (const auto& e : fs::recursive_directory_iterator(dir)) {
        if (e.path().extension() != ".dcm") continue;
        Image gray = decode_dicom(read_file(e.path().string()), e.path().string());
        Image rgb;
        rgb.width = gray.width;
        rgb.height = gray.height;
        rgb.channels = 3;
        for (size_t i = 0; i < gray.data.size() / 2; ++i) {
          const uint8_t v = gray.data[2 * i + 1];
          for (int c = 0; c < 3; ++c) rgb.data.push_back(static_cast<uint8_t>(v + 40 * c));
        }
        write_file(e.path().string(), encode_dicom(rgb, DicomWriteOptions{}));
      }
    }
    auto samples = open_source(dir);
    // Resize to 40, centre crop 24: a shrink, so the filter is widened.
    PipelineOptions o = eval_options(4, 24, 40);
    o.shuffle = false;
    Pipeline p(samples, o);
    p.start_epoch(0);
    Batch b;
    ASSERT_TRUE(p.next(&b));
    ASSERT_EQ(b.size, 4);
    const int C = colour ? 3 : 1;
    ASSERT_EQ(b.channels, C);
    const size_t plane = 24 * 24;
    const float* got = reinterpret_cast<const float*>(b.data);
    for (int i = 0; i < 4; ++i) {
      std::vector<uint8_t> scratch;
      const size_t idx = b.indices[static_cast<size_t>(i)];
      auto bytes = samples->bytes(idx, scratch);
      const Image whole = decode_dicom(std::vector<uint8_t>(bytes.begin(), bytes.end()), "whole");
      const CropBox box = resize_center_crop_box(whole.width, whole.height, 40, 24);
      std::vector<float> want(plane * C);
      resize_crop(whole, box, 24, 24, want.data());
      const float top = colour ? 255.f : 65535.f;
      double worst = 0;
      for (size_t k = 0; k < plane * C; ++k) {
        const double w = (want[k] / top - 0.5) / 0.25;
        worst = std::max(worst, std::fabs(got[i * plane * C + k] - w));
      }
      EXPECT_LT(worst, 1e-5) << (colour ? "colour " : "gray ") << samples->name(idx);
    }
  }
}

TEST(Pipeline, MultiLabelCsv) {
  auto dir = make_set("multilabel", "png", 4);
  auto list = scan_image_folder(dir, nullptr);
  const std::string csv = dir + "/multi.csv";
  {
    std::ofstream f(csv);
    f << "path,effusion,nodule\n";
    for (size_t i = 0; i < list.size(); ++i) {
      f << fs::relative(list[i].path, dir).string() << "," << i % 2 << "," << (i / 2) % 2 << "\n";
    }
  }
  PipelineOptions o;
  o.batch = 4;
  o.size = 8;
  o.shuffle = false;
  // A findings table: the labels are the findings marked 1 (none for sample 0), named.
  auto table = open_source(csv);
  EXPECT_EQ(table->class_names(), (std::vector<std::string>{"effusion", "nodule"}));
  Pipeline p(table, o);
  p.start_epoch(0);
  Batch b;
  ASSERT_TRUE(p.next(&b));
  ASSERT_EQ(b.size, 4);
  for (int i = 0; i < 4; ++i) {
    size_t idx = b.indices[static_cast<size_t>(i)];
    std::vector<int> want;
    if (idx % 2) want.push_back(0);
    if ((idx / 2) % 2) want.push_back(1);
    EXPECT_EQ(b.label_sets[static_cast<size_t>(i)], want) << idx;
    EXPECT_EQ(b.labels[static_cast<size_t>(i)], want.empty() ? -1 : want[0]);
  }
  // Index lists (path,label,label): the cells are class indices, and nothing is named.
  const std::string lists = dir + "/lists.csv";
  {
    std::ofstream f(lists);
    f << "path,label,label\n" << fs::relative(list[0].path, dir).string() << ",3,1\n";
  }
  auto indexed = open_source(lists);
  EXPECT_EQ(indexed->labels(0), (std::vector<int>{3, 1}));
  EXPECT_TRUE(indexed->class_names().empty());
  // A table cell other than 0 or 1, or a row with another number of findings, names the line.
  const std::string bad = dir + "/bad.csv";
  for (const char* row : {",0,2\n", ",1\n"}) {
    {
      std::ofstream f(bad);
      f << "path,effusion,nodule\n" << fs::relative(list[0].path, dir).string() << row;
    }
    try {
      open_source(bad);
      ADD_FAILURE() << "accepted " << row;
    } catch (const cohort::Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad.csv:2"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

TEST(Pipeline, BadSourcesAreClearErrors) {
  EXPECT_THROW(open_source("/nonexistent/folder"), cohort::Error);
  auto csv =
      (fs::temp_directory_path() / ("cohort-bad-" + std::to_string(::getpid()) + ".csv")).string();
  std::ofstream(csv) << "path,label\nimg.png,notanumber\n";
  try {
    open_source(csv);
    FAIL();
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find(":2:"), std::string::npos) << e.what();
  }
  fs::remove(csv);
}

TEST(Shards, PackedDataReadsBackIdenticallyAndDamageIsNamed) {
  auto dir = make_set("shards", "jpeg", 23);
  auto folder = open_source(dir);
  const std::string out = dir + "-packed";
  fs::remove_all(out);
  PackSummary sum = pack(*folder, PackOptions{out, 4});
  EXPECT_EQ(sum.records, 23u);
  auto shards = open_source(out);  // a folder of .cshard files opens as shards
  ASSERT_EQ(shards->size(), folder->size());
  std::vector<uint8_t> a, b;
  for (size_t i = 0; i < folder->size(); ++i) {
    auto x = folder->bytes(i, a);
    auto y = shards->bytes(i, b);
    ASSERT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << "record " << i;
    EXPECT_EQ(folder->labels(i), shards->labels(i));
  }
  PipelineOptions o;
  o.batch = 5;
  o.size = 16;
  EXPECT_EQ(run(folder, o, 1), run(shards, o, 1));
  // Flip one payload byte of shard 2: reading that record names the shard and the record.
  const std::string victim = out + "/shard_00002.cshard";
  auto raw = read_file(victim);
  raw[100] ^= 0xff;
  write_file(victim, raw);
  auto damaged = open_shards(out);
  size_t errors = 0;
  for (size_t i = 0; i < damaged->size(); ++i) {
    try {
      damaged->bytes(i, a);
    } catch (const DecodeError& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find("shard_00002.cshard record"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(errors, 1u);
  // A damaged index is refused when the shard is opened.
  raw = read_file(victim);
  raw[raw.size() - 3] ^= 0xff;
  write_file(victim, raw);
  try {
    open_shards(out);
    FAIL() << "opened a shard with a damaged index";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard_00002.cshard"), std::string::npos) << e.what();
  }
  raw.resize(30);
  write_file(victim, raw);
  EXPECT_THROW(open_shards(out), cohort::Error);
  fs::remove_all(out);
  fs::remove_all(dir);
}

namespace {

// Every sample's output bytes by data set index, for one epoch.
std::map<size_t, std::vector<uint8_t>> samples_of(std::shared_ptr<const Source> s,
                                                  PipelineOptions o) {
  Pipeline p(s, o);
  p.start_epoch(0);
  std::map<size_t, std::vector<uint8_t>> out;
  Batch b;
  while (p.next(&b)) {
    const size_t per = b.bytes / static_cast<size_t>(b.size);
    for (int i = 0; i < b.size; ++i) {
      const uint8_t* at = b.data + static_cast<size_t>(i) * per;
      out[b.indices[static_cast<size_t>(i)]].assign(at, at + per);
    }
  }
  return out;
}

template <class T>
std::vector<T> as(const std::vector<uint8_t>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace

// bf16 output is the f32 output rounded to bf16; u8 output is the same pixels before
// normalisation, in 0..255 (within rounding); both from the same crops and flips.
TEST(Pipeline, Bf16AndU8OutputsAreTheF32OnesConverted) {
  auto dir = make_set("outtypes", "png", 12);
  auto src = open_source(dir);
  PipelineOptions o;
  o.batch = 4;
  o.size = 16;
  o.workers = 2;
  o.seed = 3;
  o.mean = {0.5f};
  o.std = {0.25f};
  auto f32 = samples_of(src, o);
  o.out = OutType::bf16;
  auto bf16 = samples_of(src, o);
  o.out = OutType::u8;
  auto u8 = samples_of(src, o);
  ASSERT_EQ(f32.size(), 12u);
  ASSERT_EQ(bf16.size(), 12u);
  ASSERT_EQ(u8.size(), 12u);
  for (const auto& [idx, bytes] : f32) {
    const auto f = as<float>(bytes);
    const auto b = as<uint16_t>(bf16[idx]);
    const auto& u = u8[idx];
    ASSERT_EQ(b.size(), f.size());
    ASSERT_EQ(u.size(), f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      ASSERT_EQ(b[i], cohort::f32_to_bf16(f[i])) << "sample " << idx << " element " << i;
      const double pixel = (f[i] * 0.25 + 0.5) * 255.0;  // undo normalize, back to 0..255
      ASSERT_NEAR(u[i], pixel, 0.51) << "sample " << idx << " element " << i;
    }
  }
  fs::remove_all(dir);
}

// Vertical flips: with them on, each sample is either what it was without them or its exact
// upside-down mirror (the same crop), and some are flipped and some not.
TEST(Pipeline, VerticalFlipMirrorsRows) {
  auto dir = make_set("vflip", "png", 24);
  auto src = open_source(dir);
  PipelineOptions o;
  o.batch = 4;
  o.size = 16;
  o.workers = 2;
  o.seed = 9;
  o.hflip = false;
  auto plain = samples_of(src, o);
  o.vflip = true;
  auto flipped = samples_of(src, o);
  ASSERT_EQ(plain.size(), 24u);
  int mirrored = 0, same = 0;
  for (const auto& [idx, bytes] : plain) {
    const auto a = as<float>(bytes), b = as<float>(flipped[idx]);
    ASSERT_EQ(a.size(), 16u * 16u);  // one channel, NCHW
    if (a == b) {
      ++same;
      continue;
    }
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x)
        ASSERT_EQ(b[static_cast<size_t>(y * 16 + x)], a[static_cast<size_t>((15 - y) * 16 + x)])
            << "sample " << idx << " row " << y;
    ++mirrored;
  }
  EXPECT_GT(mirrored, 0);
  EXPECT_GT(same, 0);
  fs::remove_all(dir);
}

// Batches acquired and held (as the Python loader's tensors hold them) keep their bytes while
// the pipeline goes on, into new buffers once every buffer is held, and across an epoch; the
// bytes equal those next() gives.
TEST(Pipeline, HeldBatchesKeepTheirBytesAndTheSameSamples) {
  auto dir = make_set("held", "png", 30);
  auto samples = open_source(dir);
  PipelineOptions o;
  o.batch = 4;
  o.size = 16;
  o.seed = 9;
  o.prefetch = 1;  // two buffers: holding every batch forces the pipeline to add buffers
  o.hash_samples = true;
  auto want = run(samples, o, 0);
  Pipeline p(samples, o);
  p.start_epoch(0);
  struct Held {
    size_t ticket;
    Batch batch;
    std::vector<uint8_t> copy;
  };
  std::vector<Held> held;
  Batch b;
  while (auto t = p.acquire(&b)) {
    held.push_back({*t, b, std::vector<uint8_t>(b.data, b.data + b.bytes)});
  }
  ASSERT_EQ(held.size(), 8u);  // 30 samples in batches of 4
  std::map<size_t, uint64_t> got;
  for (const auto& h : held) {
    EXPECT_EQ(0, std::memcmp(h.batch.data, h.copy.data(), h.copy.size()));
    for (int i = 0; i < h.batch.size; ++i) {
      got[h.batch.indices[static_cast<size_t>(i)]] = h.batch.sample_hashes[static_cast<size_t>(i)];
    }
  }
  EXPECT_EQ(got, want);
  // Released out of order, half of them; a new epoch runs beside the ones still held.
  for (size_t i = 0; i < held.size(); i += 2) p.release(held[i].ticket);
  EXPECT_THROW(p.release(held[0].ticket), cohort::Error);
  p.start_epoch(1);
  size_t batches = 0;
  while (p.next(&b)) ++batches;
  EXPECT_EQ(batches, 8u);
  for (size_t i = 1; i < held.size(); i += 2) {
    EXPECT_EQ(0, std::memcmp(held[i].batch.data, held[i].copy.data(), held[i].copy.size()));
    p.release(held[i].ticket);
  }
  fs::remove_all(dir);
}

// --decode/--augment-on gpu: decoding on the device needs the operators there too (its images
// stay on the device), and either needs this process's GPU; without one (or without the GPU
// parts) the pipeline refuses at construction with the reason, before any worker starts. (No
// test of this binary chooses a GPU, so there is none chosen here on any machine.)
TEST(Pipeline, GpuStagesNeedEachOtherAndADevice) {
  ASSERT_FALSE(cohort::cuda::device_chosen());
  auto dir = make_set("gpu-stages", "jpeg", 4);
  auto src = open_source(dir);
  PipelineOptions o;
  o.batch = 2;
  o.size = 16;
  o.decode = Placement::gpu;
  try {
    Pipeline p(src, o);
    FAIL() << "decode on the GPU with the operators on the CPU was accepted";
  } catch (const cohort::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--decode gpu needs --augment-on gpu"), std::string::npos)
        << e.what();
  }
  o.augment = Placement::gpu;
  for (Placement decode : {Placement::gpu, Placement::cpu}) {
    o.decode = decode;
    try {
      Pipeline p(src, o);
      FAIL() << "a GPU stage was accepted without a GPU";
    } catch (const cohort::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("--decode ") + placement_name(decode) + " --augment-on gpu: "),
                std::string::npos)
          << m;
      EXPECT_TRUE(m.find(cohort::cuda::unavailable_reason()) != std::string::npos ||
                  m.find("no CUDA device chosen") != std::string::npos)
          << m;
    }
  }
  o.decode = o.augment = Placement::cpu;
  Pipeline p(src, o);  // the CPU stages, as before
  EXPECT_FALSE(p.on_device());
  EXPECT_EQ(p.stats().placement, "decode cpu, augment cpu");
  p.start_epoch(0);
  Batch b;
  ASSERT_TRUE(p.next(&b));
  EXPECT_FALSE(b.on_device);
  fs::remove_all(dir);
}
