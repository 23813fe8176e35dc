// The call description's wire form: the header in front of every message, parsed back, matched
// against the call this rank is running, and printed for errors.
#include "call.h"

namespace cohort::comm::detail {

wire::MsgHeader CollDesc::header(uint64_t payload_bytes) const {
  wire::MsgHeader h;
  h.coll = static_cast<uint8_t>(coll);
  h.dtype = static_cast<uint8_t>(dtype);
  h.redop = static_cast<uint8_t>(op);
  h.seq = seq;
  h.root = root;
  h.count = count;
  h.bytes = payload_bytes;
  return h;
}

CollDesc CollDesc::of(const wire::MsgHeader& h) {
  CollDesc d;
  d.coll = static_cast<Coll>(h.coll);
  d.dtype = static_cast<DataType>(h.dtype);
  d.op = static_cast<RedOp>(h.redop);
  d.seq = h.seq;
  d.root = h.root;
  d.count = h.count;
  return d;
}

bool CollDesc::matches(const wire::MsgHeader& h) const {
  const wire::MsgHeader mine = header(h.bytes);
  const bool p2p = coll == Coll::sendrecv;
  return h.coll == mine.coll && h.seq == mine.seq && h.count == mine.count &&
         h.dtype == mine.dtype && (p2p || (h.redop == mine.redop && h.root == mine.root));
}

std::string CollDesc::str() const {
  std::string s = std::string(collective_name(coll)) + "(count=" + std::to_string(count) + ", " +
                  dtype_name(dtype);
  if (coll == Coll::allreduce || coll == Coll::reduce || coll == Coll::reduce_scatter) {
    s += std::string(", ") + redop_name(op);
  }
  if (coll == Coll::broadcast || coll == Coll::reduce || coll == Coll::gather ||
      coll == Coll::scatter) {
    s += ", root=" + std::to_string(root);
  }
  return s + ", call #" + std::to_string(seq) + ")";
}

}  // namespace cohort::comm::detail
