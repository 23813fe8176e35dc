// The API: each call's arguments are checked, its algorithm chosen once (choose_algorithm), and
// the call numbered and queued; it returns a Work at once. A call that cannot run as asked (a
// forced algorithm this group cannot run, a root or peer outside the group) fails here, before
// anything is sent, so the communicator stays usable.
#include "cohort/core/error.h"
#include "native_comm.h"

namespace cohort::comm::detail {

void NativeComm::validate_args(const char* what, size_t count, int root, int peer) {
  if (count > (1ull << 40)) COHORT_THROW(what << ": count " << count << " is not plausible");
  if (root < 0 || root >= size()) {
    COHORT_THROW(what << ": root " << root << " is outside 0.." << size() - 1);
  }
  if (peer != -1 && (peer < 0 || peer >= size() || peer == rank_)) {
    COHORT_THROW(what << ": peer " << peer << " is not another rank of 0.." << size() - 1);
  }
}

AlgoChoice NativeComm::choose(Coll kind, size_t bytes, Algo forced) {
  // Bytes below 2^48 (counts are at most 2^40 elements of at most 8 bytes).
  const uint64_t key = (static_cast<uint64_t>(kind) << 56) ^ (static_cast<uint64_t>(forced) << 52) ^
                       static_cast<uint64_t>(bytes);
  auto it = choices_.find(key);
  if (it != choices_.end()) return it->second;
  const AlgoChoice a = choose_algorithm(kind, bytes, forced, settings_.algo, engine_->topology(),
                                        engine_->shared().ever());
  if (choices_.size() > 4096) choices_.clear();
  choices_.emplace(key, a);
  return a;
}

Work NativeComm::issue(Coll kind, const void* send, void* recv, size_t count, DataType t, RedOp op,
                       int root, Algo forced) {
  const char* what = collective_name(kind);
  validate_args(what, count, root, -1);
  // The cost model counts an allgather's whole result.
  const size_t bytes =
      count * dtype_size(t) * (kind == Coll::allgather ? static_cast<size_t>(size()) : 1);
  AlgoChoice a;
  try {
    a = choose(kind, bytes, forced);
  } catch (const Error& e) {
    COHORT_THROW("rank " << rank_ << ": " << e.message());
  }
  Call c;
  c.desc.coll = kind;
  c.desc.dtype = t;
  c.desc.op = op;
  c.desc.seq = next_seq_++;
  c.desc.root = static_cast<uint32_t>(root);
  c.desc.count = count;
  c.send = send;
  c.recv = recv;
  c.algo = a.algo;
  c.reason = a.reason;
  return submit(c);
}

Work NativeComm::allreduce(const void* s, void* r, size_t count, DataType t, RedOp op,
                           CollOptions o) {
  return issue(Coll::allreduce, s, r, count, t, op, 0, o.algo);
}

Work NativeComm::reduce_scatter(const void* s, void* r, size_t count, DataType t, RedOp op,
                                CollOptions o) {
  return issue(Coll::reduce_scatter, s, r, count, t, op, 0, o.algo);
}

Work NativeComm::allgather(const void* s, void* r, size_t count, DataType t, CollOptions o) {
  return issue(Coll::allgather, s, r, count, t, RedOp::sum, 0, o.algo);
}

Work NativeComm::broadcast(const void* s, void* r, size_t count, DataType t, int root,
                           CollOptions o) {
  return issue(Coll::broadcast, s, r, count, t, RedOp::sum, root, o.algo);
}

Work NativeComm::reduce(const void* s, void* r, size_t count, DataType t, RedOp op, int root,
                        CollOptions o) {
  return issue(Coll::reduce, s, r, count, t, op, root, o.algo);
}

Work NativeComm::alltoall(const void* s, void* r, size_t count, DataType t, CollOptions o) {
  return issue(Coll::alltoall, s, r, count, t, RedOp::sum, 0, o.algo);
}

Work NativeComm::gather(const void* s, void* r, size_t count, DataType t, int root, CollOptions o) {
  return issue(Coll::gather, s, r, count, t, RedOp::sum, root, o.algo);
}

Work NativeComm::scatter(const void* s, void* r, size_t count, DataType t, int root,
                         CollOptions o) {
  return issue(Coll::scatter, s, r, count, t, RedOp::sum, root, o.algo);
}

Work NativeComm::barrier() {
  return issue(Coll::barrier, nullptr, nullptr, 0, DataType::u8, RedOp::sum, 0, Algo::automatic);
}

// Point-to-point calls are numbered per peer and direction, so that they match whatever
// collectives run in between.
Work NativeComm::point_to_point(bool is_send, const void* send, void* recv, size_t count,
                                DataType t, int peer) {
  validate_args(is_send ? "send" : "recv", count, 0, peer);
  Call c;
  c.desc.coll = Coll::sendrecv;
  c.desc.dtype = t;
  c.desc.seq = (is_send ? send_seq_ : recv_seq_)[static_cast<size_t>(peer)]++;
  c.desc.count = count;
  c.send = send;
  c.recv = recv;
  c.algo = Algo::direct;
  c.reason = "the only algorithm";
  c.peer = peer;
  c.is_send = is_send;
  return submit(c);
}

Work NativeComm::send(const void* data, size_t count, DataType t, int peer) {
  return point_to_point(true, data, nullptr, count, t, peer);
}

Work NativeComm::recv(void* data, size_t count, DataType t, int peer) {
  return point_to_point(false, nullptr, data, count, t, peer);
}

}  // namespace cohort::comm::detail
