// `cohort make-dataset scans` and `cohort bench data`.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cohort/comm/communicator.h"
#include "cohort/core/clock.h"
#include "cohort/core/cuda.h"
#include "cohort/core/error.h"
#include "cohort/core/rng.h"
#include "cohort/data/pipeline.h"
#include "cohort/data/scans.h"
#include "cohort/data/shards.h"
#include "verbs.h"

namespace cohort::cli {

Run add_make_dataset(CLI::App& app) {
  auto o = std::make_shared<data::ScanSetOptions>();
  auto kind = std::make_shared<std::string>();
  app.add_option("kind", *kind, "What to make: scans")->required()->check(CLI::IsMember({"scans"}));
  app.add_option("--out", o->out, "Output folder")->required();
  app.add_option("--count", o->count, "Number of images")->check(CLI::Range(1, 10000000));
  app.add_option("--format", o->format, "png, jpeg or dicom")
      ->check(CLI::IsMember({"png", "jpeg", "dicom"}));
  app.add_option("--size", o->width, "Width (and height unless --height) in pixels");
  app.add_option("--height", o->height, "Height in pixels (default: --size)");
  app.add_option("--channels", o->channels, "1 (gray) or 3 (the gray scan as RGB)");
  app.add_option("--bits", o->bits, "PNG bit depth: 8 or 16");
  app.add_option("--quality", o->quality, "JPEG quality")->check(CLI::Range(1, 100));
  app.add_option("--lesion-fraction", o->lesion_fraction, "Fraction of images with a lesion")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", o->seed, "Seed: the same seed gives the same files");
  return [o, kind]() -> int {
    data::ScanSetSummary s = data::make_scans(*o);
    std::printf("make-dataset: %d images (%d normal, %d lesion, %.1f MB) in %s\n",
                s.normal + s.lesion, s.normal, s.lesion, s.bytes / 1e6, o->out.c_str());
    return 0;
  };
}

Run add_pack(CLI::App& app) {
  auto src = std::make_shared<std::string>();
  auto o = std::make_shared<data::PackOptions>();
  app.add_option("source", *src, "ImageFolder or CSV list to pack")->required();
  app.add_option("--out", o->out, "Output folder for the shards")->required();
  app.add_option("--shards", o->shards, "Number of shard files")->check(CLI::Range(1, 100000));
  return [src, o]() -> int {
    auto source = data::open_source(*src);
    auto t0 = Clock::now();
    data::PackSummary s = data::pack(*source, *o);
    std::printf("pack: %zu records, %.1f MB in %d shards under %s (%.1f s)\n", s.records,
                s.bytes / 1e6, o->shards, o->out.c_str(), seconds_since(t0));
    return 0;
  };
}

Run add_bench_data(CLI::App& app) {
  struct Opts {
    std::string source, json, layout = "nchw", out = "f32";
    std::vector<double> window;
    int batch = 32, workers = 2, size = 224, prefetch = 2, batches = 0, epochs = 0, channels = 0,
        warmup = 0;
    uint64_t seed = 0;
    bool digest = false, fail = false, eval = false, accurate_dct = false;
    std::string decode = "cpu", augment = "cpu";
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--source", o->source, "ImageFolder or CSV list")->required();
  app.add_option("--batch", o->batch, "Samples per batch")->check(CLI::Range(1, 65536));
  app.add_option("--workers", o->workers, "Worker threads")->check(CLI::Range(1, 256));
  app.add_option("--size", o->size, "Output height and width")->check(CLI::Range(1, 16384));
  app.add_option("--prefetch", o->prefetch, "Batches prepared ahead")->check(CLI::Range(1, 64));
  app.add_option("--batches", o->batches, "Stop after this many batches");
  app.add_option("--epochs", o->epochs, "Run this many epochs (default 1 unless --batches)");
  app.add_option("--warmup", o->warmup,
                 "Batches taken before the clock starts (as the PyTorch loader peers do)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--channels", o->channels, "3: repeat gray to 3 channels");
  app.add_option("--layout", o->layout, "nchw or nhwc")->check(CLI::IsMember({"nchw", "nhwc"}));
  app.add_option("--out-type", o->out, "f32, bf16 or u8")
      ->check(CLI::IsMember({"f32", "bf16", "u8"}));
  app.add_option("--seed", o->seed, "Seed of the sampler and the augmentations");
  app.add_option("--window", o->window, "DICOM window CENTER WIDTH (default: each file's)")
      ->expected(2);
  app.add_flag("--digest", o->digest, "Print a hash of every batch's bytes and of the whole run");
  app.add_flag("--fail-on-corrupt", o->fail, "Stop at the first unreadable file (default: skip)");
  app.add_flag("--eval", o->eval, "Resize + center crop instead of the training augmentations");
  app.add_flag("--accurate-dct", o->accurate_dct,
               "JPEG: libjpeg-turbo's accurate inverse DCT instead of its fast one");
  app.add_option("--decode", o->decode,
                 "cpu, or gpu: JPEG's IDCT and colour and DICOM's window on this rank's GPU")
      ->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--augment-on", o->augment,
                 "cpu, or gpu: crop, resize, flips, rotation, jitter, normalisation on the GPU")
      ->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--json", o->json, "Write the figures as JSON");
  return [o]() -> int {
    comm::JobEnv job = comm::detect_job_env();  // shard by rank when launched with several
    const bool gpu = o->decode == "gpu" || o->augment == "gpu";
    if (gpu) {
      cuda::use_device(job.local_rank, "--decode " + o->decode + " --augment-on " + o->augment +
                                           " (local rank " + std::to_string(job.local_rank) + ")");
    }
    data::PipelineOptions po;
    po.batch = o->batch;
    po.workers = o->workers;
    po.size = o->size;
    po.prefetch = o->prefetch;
    po.seed = o->seed;
    po.channels = o->channels;
    po.train = !o->eval;
    po.layout = o->layout == "nchw" ? data::Layout::nchw : data::Layout::nhwc;
    po.out = o->out == "f32"    ? data::OutType::f32
             : o->out == "bf16" ? data::OutType::bf16
                                : data::OutType::u8;
    po.fail_on_corrupt = o->fail;
    po.idct = o->accurate_dct ? data::Idct::accurate : data::Idct::fast;
    po.hash_samples = o->digest;
    if (o->window.size() == 2) po.window = data::Window{o->window[0], o->window[1]};
    po.world = job.world;
    po.rank = job.rank;
    po.decode = o->decode == "gpu" ? data::Placement::gpu : data::Placement::cpu;
    po.augment = o->augment == "gpu" ? data::Placement::gpu : data::Placement::cpu;
    data::Pipeline p(data::open_source(o->source), po);
    const int epochs = o->epochs > 0 ? o->epochs : (o->batches > 0 ? 1 << 30 : 1);
    uint64_t total = 0, n_batches = 0, images = 0, timed_images = 0;
    auto t0 = Clock::now();  // restarted after the warm-up batches
    auto last_print = t0;
    for (int e = 0; e < epochs; ++e) {
      p.start_epoch(static_cast<uint64_t>(e));
      data::Batch b;
      bool more = true;
      while ((more = p.next(&b))) {
        if (o->digest) {  // hashing 20 MB batches costs a core: only when asked
          uint64_t h = mix64(n_batches);
          const uint64_t* w = reinterpret_cast<const uint64_t*>(b.data);
          for (size_t i = 0; i < b.bytes / 8; ++i) h = mix64(h ^ w[i]);
          total = mix64(total ^ h);
          std::printf("batch %llu %016llx\n", static_cast<unsigned long long>(n_batches),
                      static_cast<unsigned long long>(h));
        }
        images += static_cast<uint64_t>(b.size);
        ++n_batches;
        if (n_batches == static_cast<uint64_t>(o->warmup)) {
          t0 = Clock::now();
        } else if (n_batches > static_cast<uint64_t>(o->warmup)) {
          timed_images += static_cast<uint64_t>(b.size);
        }
        if (seconds_since(last_print) > 5) {
          last_print = Clock::now();
          std::fprintf(stderr, "bench data: epoch %d, %llu batches, %.1f images/s\n", e,
                       static_cast<unsigned long long>(n_batches),
                       timed_images / seconds_since(t0));
        }
        if (o->batches > 0 && n_batches >= static_cast<uint64_t>(o->batches)) break;
      }
      if (o->batches > 0 && n_batches >= static_cast<uint64_t>(o->batches)) break;
    }
    const double secs = seconds_since(t0);
    data::PipelineStats st = p.stats();
    if (n_batches <= static_cast<uint64_t>(o->warmup)) {
      COHORT_THROW("bench data: --warmup " << o->warmup << " takes every one of the " << n_batches
                                           << " batches; none was timed");
    }
    const double ips = timed_images / secs;
    std::printf("# cohort bench data: %s, batch %d, %d workers, %dx%d, rank %d/%d\n",
                o->source.c_str(), o->batch, o->workers, o->size, o->size, job.rank, job.world);
    std::printf("images/s %.1f  batches %llu  images %llu  skipped %llu  seconds %.2f", ips,
                static_cast<unsigned long long>(n_batches), static_cast<unsigned long long>(images),
                static_cast<unsigned long long>(st.skipped), secs);
    if (o->warmup > 0) std::printf("  (timed after %d warm-up batches)", o->warmup);
    std::printf("\n");
    std::printf("stages: %s", st.placement.c_str());
    if (p.on_device() && st.batches) {
      std::printf("; device stage %.2f ms/batch", 1e3 * st.device_s / st.batches);
    }
    std::printf("\n");
    const double per = st.images ? 1e3 / st.images : 0;
    std::printf(
        "ms/image per operator: read %.3f decode %.3f crop+resize %.3f flip+normalize %.3f; "
        "consumer waited %.2f s; ready batches on arrival %.2f\n",
        st.read_s * per, st.decode_s * per, st.resize_s * per, st.post_s * per, st.consumer_wait_s,
        st.mean_queue);
    if (o->digest) std::printf("digest %016llx\n", static_cast<unsigned long long>(total));
    if (!o->json.empty()) {
      nlohmann::json j = {{"source", o->source},
                          {"batch", o->batch},
                          {"workers", o->workers},
                          {"size", o->size},
                          {"images_per_s", ips},
                          {"images", images},
                          {"batches", n_batches},
                          {"skipped", st.skipped},
                          {"seconds", secs},
                          {"warmup_batches", o->warmup},
                          {"ms_read", st.read_s * per},
                          {"ms_decode", st.decode_s * per},
                          {"ms_resize", st.resize_s * per},
                          {"ms_post", st.post_s * per},
                          {"consumer_wait_s", st.consumer_wait_s},
                          {"mean_queue", st.mean_queue},
                          {"stages", st.placement},
                          {"device_s", st.device_s}};
      if (o->digest) {
        char hex[17];
        std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(total));
        j["digest"] = hex;
      }
      std::ofstream f(o->json);
      if (!f) COHORT_THROW("cannot write --json file '" << o->json << "'");
      f << j.dump(2) << "\n";
    }
    return 0;
  };
}

}  // namespace cohort::cli
