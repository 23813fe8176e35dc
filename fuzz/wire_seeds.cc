// Writes the committed seed corpus of fuzz_wire (fuzz/corpus/wire): one valid input per store
// command and reply status, a transport hello and message headers, each made by the real
// encoders and prefixed with the byte that selects the parser. Rerun after a wire change:
//   build-fuzz/bin/wire_seeds fuzz/corpus/wire
#include <cstdio>
#include <fstream>
#include <string>

#include "wire.h"

using namespace cohort::comm::wire;

namespace {
void write(const std::string& dir, const std::string& name, char which, const std::string& body) {
  std::ofstream f(dir + "/" + name, std::ios::binary);
  f.put(which);
  f << body;
}
std::string unframed(const std::string& framed) {
  return framed.substr(4);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wire_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const StoreCmd cmds[] = {StoreCmd::hello, StoreCmd::set,         StoreCmd::get,
                           StoreCmd::add,   StoreCmd::compare_set, StoreCmd::wait,
                           StoreCmd::erase, StoreCmd::num_keys};
  for (StoreCmd c : cmds) {
    StoreRequest r;
    r.cmd = c;
    r.key = "rank/3";
    r.value = "node1\n4242";
    r.expected = "";
    r.delta = 1;
    r.timeout_ms = 2000;
    r.keys = {"peer/0", "peer/1"};
    write(dir, "request-" + std::to_string(static_cast<int>(c)), 0, unframed(encode(r)));
  }
  for (StoreStatus s : {StoreStatus::ok, StoreStatus::timeout, StoreStatus::error}) {
    StoreReply r;
    r.status = s;
    r.value = "127.0.0.1:29500";
    r.number = 7;
    write(dir, "reply-" + std::to_string(static_cast<int>(s)), 1, unframed(encode(r)));
  }
  Hello h;
  h.token = "job-token-0123456789";
  h.comm_id = 0x1234567890abcdefull;
  h.rank = 2;
  h.stream = 1;
  write(dir, "hello", 2, unframed(encode(h)));
  for (int coll = 1; coll <= 10; ++coll) {
    MsgHeader m;
    m.coll = static_cast<uint8_t>(coll);
    m.dtype = static_cast<uint8_t>(coll % 7);
    m.redop = static_cast<uint8_t>(coll % 5);
    m.seq = 41u + static_cast<uint32_t>(coll);
    m.count = 1031;
    m.bytes = 4124;
    write(dir, "header-" + std::to_string(coll), 3,
          std::string(reinterpret_cast<const char*>(&m), sizeof(m)));
  }
  return 0;
}
