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

uint8_t Reader::u8() {
  need(1, "u8");
  uint8_t v = *p_;
  p_ += 1;
  n_ -= 1;
  return v;
}

uint32_t Reader::u32() {
  need(4, "u32");
  uint32_t v;
  std::memcpy(&v, p_, 4);
  p_ += 4;
  n_ -= 4;
  return v;
}

uint64_t Reader::u64() {
  need(8, "u64");
  uint64_t v;
  std::memcpy(&v, p_, 8);
  p_ += 8;
  n_ -= 8;
  return v;
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
