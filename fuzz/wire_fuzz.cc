// Feeds arbitrary bytes to every parser that reads from a socket: store requests and replies,
// the transport hello and the message header. Any input may be rejected (WireError) but none may
// crash, hang or read out of bounds; what parses must encode back to an equivalent request.
#include <cstdint>
#include <cstring>
#include <string>

#include "wire.h"

using namespace cohort::comm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 4;
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  try {
    switch (which) {
      case 0: {
        wire::StoreRequest r = wire::parse_store_request(p, n);
        std::string f = wire::encode(r);
        wire::StoreRequest again =
            wire::parse_store_request(reinterpret_cast<const uint8_t*>(f.data()) + 4, f.size() - 4);
        if (again.key != r.key || again.value != r.value || again.keys != r.keys) __builtin_trap();
        break;
      }
      case 1:
        wire::parse_store_reply(p, n);
        break;
      case 2:
        wire::parse_hello(p, n);
        break;
      case 3:
        wire::parse_header(p, n);
        break;
    }
  } catch (const wire::WireError&) {
  }
  return 0;
}
