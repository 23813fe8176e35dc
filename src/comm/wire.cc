#include "wire.h"

#include <cstring>

namespace cohort::comm::wire {

std::string encode(const StoreRequest& r) {
  Writer w;
  w.u8(static_cast<uint8_t>(r.cmd));
  switch (r.cmd) {
    case StoreCmd::hello:
    case StoreCmd::erase:
      w.str(r.key);
      break;
    case StoreCmd::set:
      w.str(r.key);
      w.str(r.value);
      break;
    case StoreCmd::get:
      w.str(r.key);
      w.u32(r.timeout_ms);
      break;
    case StoreCmd::add:
      w.str(r.key);
      w.u64(static_cast<uint64_t>(r.delta));
      break;
    case StoreCmd::compare_set:
      w.str(r.key);
      w.str(r.expected);
      w.str(r.value);
      break;
    case StoreCmd::wait:
      w.u32(static_cast<uint32_t>(r.keys.size()));
      for (const auto& k : r.keys) w.str(k);
      w.u32(r.timeout_ms);
      break;
    case StoreCmd::num_keys:
      break;
  }
  return w.framed();
}

StoreRequest parse_store_request(const uint8_t* body, size_t n) {
  Reader rd(body, n);
  StoreRequest r;
  uint8_t cmd = rd.u8();
  if (cmd < 1 || cmd > static_cast<uint8_t>(StoreCmd::num_keys)) {
    COHORT_THROW_AS(WireError, "unknown store command " << int(cmd));
  }
  r.cmd = static_cast<StoreCmd>(cmd);
  switch (r.cmd) {
    case StoreCmd::hello:
    case StoreCmd::erase:
      r.key = rd.str();
      break;
    case StoreCmd::set:
      r.key = rd.str();
      r.value = rd.str();
      break;
    case StoreCmd::get:
      r.key = rd.str();
      r.timeout_ms = rd.u32();
      break;
    case StoreCmd::add:
      r.key = rd.str();
      r.delta = static_cast<int64_t>(rd.u64());
      break;
    case StoreCmd::compare_set:
      r.key = rd.str();
      r.expected = rd.str();
      r.value = rd.str();
      break;
    case StoreCmd::wait: {
      uint32_t k = rd.u32();
      if (k > kMaxKeys)
        COHORT_THROW_AS(WireError, "wait on " << k << " keys (max " << kMaxKeys << ")");
      for (uint32_t i = 0; i < k; ++i) r.keys.push_back(rd.str());
      r.timeout_ms = rd.u32();
      break;
    }
    case StoreCmd::num_keys:
      break;
  }
  rd.expect_done("store request");
  return r;
}

std::string encode(const StoreReply& r) {
  Writer w;
  w.u8(static_cast<uint8_t>(r.status));
  w.str(r.value);
  w.u64(static_cast<uint64_t>(r.number));
  return w.framed();
}

StoreReply parse_store_reply(const uint8_t* body, size_t n) {
  Reader rd(body, n);
  StoreReply r;
  uint8_t st = rd.u8();
  if (st > 2) COHORT_THROW_AS(WireError, "bad store status " << int(st));
  r.status = static_cast<StoreStatus>(st);
  r.value = rd.str();
  r.number = static_cast<int64_t>(rd.u64());
  rd.expect_done("store reply");
  return r;
}

std::string encode(const Hello& h) {
  Writer w;
  w.u32(kHelloMagic);
  w.str(h.token);
  w.u64(h.comm_id);
  w.u32(h.rank);
  w.u32(h.stream);
  return w.framed();
}

Hello parse_hello(const uint8_t* body, size_t n) {
  Reader rd(body, n);
  if (rd.u32() != kHelloMagic) COHORT_THROW_AS(WireError, "not a Cohort transport hello");
  Hello h;
  h.token = rd.str();
  h.comm_id = rd.u64();
  h.rank = rd.u32();
  h.stream = rd.u32();
  rd.expect_done("hello");
  return h;
}

MsgHeader parse_header(const uint8_t* p, size_t n) {
  if (n < sizeof(MsgHeader))
    COHORT_THROW_AS(WireError, "truncated message header (" << n << " bytes)");
  MsgHeader h;
  std::memcpy(&h, p, sizeof(h));
  if (h.magic != kMsgMagic) {
    COHORT_THROW_AS(WireError, "bad message magic 0x"
                                   << std::hex << h.magic
                                   << ": stream out of sync or not a Cohort peer");
  }
  if (h.dtype > 6 || h.redop > 4 || h.coll > 32) {
    COHORT_THROW_AS(WireError, "message header out of range (coll " << int(h.coll) << ", dtype "
                                                                    << int(h.dtype) << ", redop "
                                                                    << int(h.redop) << ")");
  }
  if (h.bytes > kMaxMessage)
    COHORT_THROW_AS(WireError, "message of " << h.bytes << " bytes is too large");
  return h;
}

}  // namespace cohort::comm::wire
