// Record shards: Cohort's packed format for large data sets (docs/shards.md). One sequential
// file per shard: a header, the payloads back to back, then an index with each record's
// offset, size, CRC-32C, labels and name, and the index's own CRC. Readers map the shard and
// ask the kernel to read it ahead; every record's checksum is verified when it is read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cohort/data/source.h"

namespace cohort::data {

uint32_t crc32c(const uint8_t* p, size_t n, uint32_t crc = 0);

struct PackOptions {
  std::string out;
  int shards = 1;
};

struct PackSummary {
  size_t records = 0;
  uint64_t bytes = 0;
};

// Packs every sample of `src`, in order, round-robin into `shards` files (written to a
// temporary name and renamed when complete).
PackSummary pack(const Source& src, const PackOptions& opt);

// Opens every *.cshard in `dir` (sorted by name); headers and index checksums are verified here.
std::shared_ptr<Source> open_shards(const std::string& dir);

}  // namespace cohort::data
