// Bounds-checked field readers and the writer (see bytes.h).
#include "cohort/core/bytes.h"

#include <cstring>

namespace cohort::bytes {

std::string Writer::framed() const {
  std::string out;
  uint32_t len = static_cast<uint32_t>(buf_.size());
  out.append(reinterpret_cast<const char*>(&len), 4);
  out.append(buf_);
  return out;
}

void Reader::need(size_t k, const char* what) const {
  if (n_ < k) {
    COHORT_THROW_AS(FormatError,
                    "truncated message: need " << k << " bytes for " << what << ", have " << n_);
  }
}

template <typename T>
T Reader::fixed(const char* what) {
  need(sizeof(T), what);
  T v;
  std::memcpy(&v, p_, sizeof(T));
  p_ += sizeof(T);
  n_ -= sizeof(T);
  return v;
}

uint8_t Reader::u8() {
  return fixed<uint8_t>("u8");
}

uint32_t Reader::u32() {
  return fixed<uint32_t>("u32");
}

uint64_t Reader::u64() {
  return fixed<uint64_t>("u64");
}

std::string Reader::str() {
  uint32_t len = u32();
  need(len, "string");
  std::string s(reinterpret_cast<const char*>(p_), len);
  p_ += len;
  n_ -= len;
  return s;
}

void Reader::expect_done(const char* what) const {
  if (n_ != 0) COHORT_THROW_AS(FormatError, n_ << " trailing bytes after " << what);
}

}  // namespace cohort::bytes
