// Little-endian byte layouts written and read field by field: the store and transport messages
// (comm's wire), record-shard indexes (data). Reading is bounds-checked: a short or overlong
// buffer is a FormatError naming the field, never a read past the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/core/error.h"

namespace cohort::bytes {

class FormatError : public Error {
 public:
  using Error::Error;
};

class Writer {
 public:
  void u8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    buf_.append(s);
  }
  void raw(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  const std::string& bytes() const { return buf_; }
  std::string framed() const;  // u32 length prefix + bytes

 private:
  std::string buf_;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  std::string str();
  bool done() const { return n_ == 0; }
  void expect_done(const char* what) const;

 private:
  void need(size_t k, const char* what) const;
  template <typename T>
  T fixed(const char* what);  // a little-endian field of T's size
  const uint8_t* p_;
  size_t n_;
};

}  // namespace cohort::bytes
