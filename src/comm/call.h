// One call of the communicator as it travels from the API to an algorithm: what was asked
// (kind, type, operation, root, count, call number: the description that rides in every message
// header, so that mismatched calls are caught), the buffers, and the algorithm chosen for it once
// at issue, with the reason. Algorithms receive it as one value; nothing about the call in
// flight is shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/comm/communicator.h"
#include "cohort/comm/cost_model.h"
#include "cohort/comm/types.h"
#include "reduce/reduce.h"
#include "wire.h"

namespace cohort::comm::detail {

using Coll = Collective;

struct CollDesc {
  Coll coll = Coll::barrier;
  DataType dtype = DataType::u8;
  RedOp op = RedOp::sum;
  uint32_t seq = 0;
  uint32_t root = 0;
  uint64_t count = 0;
  std::string str() const;

  // The header in front of each message of this call, and back.
  wire::MsgHeader header(uint64_t payload_bytes) const;
  static CollDesc of(const wire::MsgHeader& h);
  // Whether a peer's header belongs to this very call (point-to-point ignores op and root).
  bool matches(const wire::MsgHeader& h) const;
};

struct Call {
  CollDesc desc;
  const void* send = nullptr;
  void* recv = nullptr;
  Algo algo = Algo::direct;  // never `automatic`: chosen at issue (choose_algorithm)
  const char* reason = "";   // why that algorithm (a static text)
  int peer = -1;             // send and recv: the other rank
  bool is_send = false;

  size_t count() const { return desc.count; }
  int root() const { return static_cast<int>(desc.root); }
  size_t esize() const { return dtype_size(desc.dtype); }
  // dst = a (op) b, elementwise over count elements of this call's type.
  void reduce_into(void* dst, const void* a, const void* b, size_t n) const {
    comm::reduce(dst, a, b, n, desc.dtype, desc.op);
  }
};

}  // namespace cohort::comm::detail
