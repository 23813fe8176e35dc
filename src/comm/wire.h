// Byte layouts of everything Cohort sends over a socket: store requests and replies, the
// transport hello, and the header in front of every point-to-point message. Parsing is pure
// (bytes in, struct out, WireError on anything malformed) so that a fuzzer can drive it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/core/bytes.h"
#include "cohort/core/error.h"

namespace cohort::comm::wire {

// Anything malformed on the wire; the field readers are core's (bytes.h).
using WireError = bytes::FormatError;
using bytes::Reader;
using bytes::Writer;

inline constexpr uint32_t kMaxFrame = 64u << 20;  // a store frame larger than this is rejected
inline constexpr size_t kMaxKeys = 4096;

// ---- store ----
enum class StoreCmd : uint8_t { hello = 1, set, get, add, compare_set, wait, erase, num_keys };
enum class StoreStatus : uint8_t { ok = 0, timeout = 1, error = 2 };

struct StoreRequest {
  StoreCmd cmd = StoreCmd::hello;
  std::string key;       // hello: the job token
  std::string value;     // set: value; compare_set: desired
  std::string expected;  // compare_set
  int64_t delta = 0;     // add
  uint32_t timeout_ms = 0;
  std::vector<std::string> keys;  // wait
};

struct StoreReply {
  StoreStatus status = StoreStatus::ok;
  std::string value;
  int64_t number = 0;
};

std::string encode(const StoreRequest& r);  // framed
StoreRequest parse_store_request(const uint8_t* body, size_t n);
std::string encode(const StoreReply& r);  // framed
StoreReply parse_store_reply(const uint8_t* body, size_t n);

// ---- transport ----
inline constexpr uint32_t kHelloMagic = 0x43485431;  // "CHT1"
struct Hello {
  std::string token;
  uint64_t comm_id = 0;
  uint32_t rank = 0;
  uint32_t stream = 0;
};
std::string encode(const Hello& h);  // framed
Hello parse_hello(const uint8_t* body, size_t n);
inline constexpr uint32_t kMaxHello = 4096;

// Every point-to-point message starts with this header: it lets the receiver check that both
// sides are in the same collective (a mismatch is reported with both descriptions).
inline constexpr uint32_t kMsgMagic = 0xC0407A11;
struct MsgHeader {
  uint32_t magic = kMsgMagic;
  uint8_t coll = 0;   // Coll enum of the collective
  uint8_t dtype = 0;  // DataType
  uint8_t redop = 0;  // RedOp
  uint8_t flags = 0;
  uint32_t seq = 0;    // collective sequence number on this communicator
  uint32_t root = 0;   // root rank where the collective has one
  uint64_t count = 0;  // element count of the collective
  uint64_t bytes = 0;  // payload bytes that follow
};
static_assert(sizeof(MsgHeader) == 32);
inline constexpr uint64_t kMaxMessage = 1ull << 40;
MsgHeader parse_header(const uint8_t* p, size_t n);  // validates magic and ranges

}  // namespace cohort::comm::wire
