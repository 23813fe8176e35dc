#include "cohort/data/shards.h"

#include <fcntl.h>
#include <nmmintrin.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cohort/core/bytes.h"
#include "cohort/core/error.h"
#include "cohort/data/image.h"

namespace fs = std::filesystem;

namespace cohort::data {

namespace {

constexpr char kMagic[8] = {'C', 'O', 'H', 'S', 'H', 'R', 'D', '1'};
constexpr size_t kHeaderBytes = 64;

struct Header {  // little-endian on disk, 64 bytes
  char magic[8];
  uint32_t version;
  uint32_t records;
  uint64_t index_offset;
  uint64_t index_bytes;
  uint32_t index_crc;
  uint8_t reserved[28];
};
static_assert(sizeof(Header) == kHeaderBytes);

uint32_t crc_table(size_t i) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82f63b78u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  return table[i];
}

__attribute__((target("sse4.2"))) uint32_t crc32c_hw(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

}  // namespace

uint32_t crc32c(const uint8_t* p, size_t n, uint32_t crc) {
  static const bool hw = __builtin_cpu_supports("sse4.2");
  if (hw) return crc32c_hw(p, n, crc);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = crc_table((c ^ p[i]) & 0xff) ^ (c >> 8);
  return ~c;
}

PackSummary pack(const Source& src, const PackOptions& opt) {
  COHORT_CHECK(opt.shards >= 1 && opt.shards <= 100000, "--shards " << opt.shards);
  fs::create_directories(opt.out);
  PackSummary sum;
  const size_t n = src.size();
  for (int s = 0; s < opt.shards; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "shard_%05d.cshard", s);
    const std::string path = (fs::path(opt.out) / name).string();
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) COHORT_THROW(tmp << ": cannot write: " << errno_string(errno));
    auto fail = [&](const std::string& what) {
      int e = errno;
      std::fclose(f);
      std::remove(tmp.c_str());
      COHORT_THROW(path << ": " << what << ": " << errno_string(e) << " (disk full?)");
    };
    Header h{};
    std::memcpy(h.magic, kMagic, 8);
    h.version = 1;
    if (std::fwrite(&h, sizeof(h), 1, f) != 1) fail("write");
    bytes::Writer index;
    uint64_t offset = kHeaderBytes;
    uint32_t records = 0;
    std::vector<uint8_t> scratch;
    for (size_t i = static_cast<size_t>(s); i < n; i += static_cast<size_t>(opt.shards)) {
      std::span<const uint8_t> bytes = src.bytes(i, scratch);
      if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
        fail("write");
      }
      index.u64(offset);
      index.u64(bytes.size());
      index.u32(crc32c(bytes.data(), bytes.size()));
      const auto& labels = src.labels(i);
      index.u32(static_cast<uint32_t>(labels.size()));
      for (int l : labels) index.u32(static_cast<uint32_t>(l));
      index.str(fs::relative(src.name(i), fs::current_path()).string());
      offset += bytes.size();
      sum.bytes += bytes.size();
      ++records;
    }
    const std::string& ix = index.bytes();
    if (!ix.empty() && std::fwrite(ix.data(), 1, ix.size(), f) != ix.size()) fail("write");
    h.records = records;
    h.index_offset = offset;
    h.index_bytes = ix.size();
    h.index_crc = crc32c(reinterpret_cast<const uint8_t*>(ix.data()), ix.size());
    if (std::fseek(f, 0, SEEK_SET) != 0 || std::fwrite(&h, sizeof(h), 1, f) != 1) fail("write");
    if (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0) fail("flush");
    if (std::fclose(f) != 0) {
      std::remove(tmp.c_str());
      COHORT_THROW(path << ": close failed: " << errno_string(errno));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) COHORT_THROW(path << ": rename failed");
    sum.records += records;
    std::fprintf(stderr, "pack: %s: %u records\n", path.c_str(), records);
  }
  return sum;
}

namespace {

struct Record {
  uint32_t shard;
  uint64_t offset, size;
  uint32_t crc;
  std::vector<int> labels;
  std::string name;
};

class ShardSource final : public Source {
 public:
  explicit ShardSource(const std::string& dir) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".cshard") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) COHORT_THROW("'" << dir << "' holds no .cshard files");
    std::vector<std::vector<Record>> per_shard;
    for (const auto& path : files) per_shard.push_back(open_one(path));
    // Records were dealt round-robin: interleave back to the packed data set's order.
    for (size_t k = 0;; ++k) {
      bool any = false;
      for (auto& v : per_shard) {
        if (k < v.size()) {
          records_.push_back(std::move(v[k]));
          any = true;
        }
      }
      if (!any) break;
    }
  }
  ~ShardSource() override {
    for (auto& m : maps_) ::munmap(m.first, m.second);
  }

  size_t size() const override { return records_.size(); }
  const std::vector<int>& labels(size_t i) const override { return records_[i].labels; }
  std::string name(size_t i) const override {
    const Record& r = records_[i];
    return paths_[r.shard] + " record " + r.name;
  }
  std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>&) const override {
    const Record& r = records_[i];
    const uint8_t* p = static_cast<const uint8_t*>(maps_[r.shard].first) + r.offset;
    if (crc32c(p, r.size) != r.crc) {
      COHORT_THROW_AS(DecodeError, name(i) << ": checksum mismatch (the shard is damaged)");
    }
    return {p, r.size};
  }

 private:
  std::vector<Record> open_one(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) COHORT_THROW(path << ": cannot open: " << errno_string(errno));
    struct stat st {};
    ::fstat(fd, &st);
    const size_t len = static_cast<size_t>(st.st_size);
    if (len < kHeaderBytes) {
      ::close(fd);
      COHORT_THROW(path << ": too short to be a shard (" << len << " bytes)");
    }
    void* m = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) COHORT_THROW(path << ": mmap failed: " << errno_string(errno));
    // Sequential read-ahead of the whole shard by the kernel.
    ::madvise(m, len, MADV_WILLNEED);
    ::madvise(m, len, MADV_SEQUENTIAL);
    maps_.emplace_back(m, len);
    paths_.push_back(path);
    Header h;
    std::memcpy(&h, m, sizeof(h));
    if (std::memcmp(h.magic, kMagic, 8) != 0 || h.version != 1) {
      COHORT_THROW(path << ": not a Cohort shard (bad magic or version)");
    }
    if (h.index_offset > len || h.index_bytes > len - h.index_offset) {
      COHORT_THROW(path << ": truncated (index at " << h.index_offset << "+" << h.index_bytes
                        << ", file " << len << " bytes)");
    }
    const uint8_t* ix = static_cast<const uint8_t*>(m) + h.index_offset;
    if (crc32c(ix, h.index_bytes) != h.index_crc) COHORT_THROW(path << ": index checksum mismatch");
    std::vector<Record> out;
    try {
      bytes::Reader rd(ix, h.index_bytes);
      for (uint32_t k = 0; k < h.records; ++k) {
        Record r;
        r.shard = static_cast<uint32_t>(maps_.size() - 1);
        r.offset = rd.u64();
        r.size = rd.u64();
        r.crc = rd.u32();
        uint32_t nl = rd.u32();
        if (nl > 4096) COHORT_THROW(path << ": record " << k << " claims " << nl << " labels");
        for (uint32_t l = 0; l < nl; ++l) r.labels.push_back(static_cast<int>(rd.u32()));
        r.name = rd.str();
        if (r.offset < kHeaderBytes || r.offset > h.index_offset ||
            r.size > h.index_offset - r.offset) {
          COHORT_THROW(path << ": record " << k << " lies outside the payload area");
        }
        out.push_back(std::move(r));
      }
    } catch (const bytes::FormatError& e) {
      COHORT_THROW(path << ": malformed index: " << e.message());
    }
    return out;
  }

  std::vector<std::pair<void*, size_t>> maps_;
  std::vector<std::string> paths_;
  std::vector<Record> records_;
};

}  // namespace

std::shared_ptr<Source> open_shards(const std::string& dir) {
  return std::make_shared<ShardSource>(dir);
}

}  // namespace cohort::data
