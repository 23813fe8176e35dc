// The one switch from a call's kind to the collective that runs it.
#include "collectives.h"

namespace cohort::comm::detail {

Algo run(Engine& e, const Call& c) {
  switch (c.desc.coll) {
    case Coll::allreduce:
      return allreduce(e, c);
    case Coll::reduce_scatter:
      return reduce_scatter(e, c);
    case Coll::allgather:
      return allgather(e, c);
    case Coll::broadcast:
      broadcast(e, c);
      break;
    case Coll::reduce:
      reduce(e, c);
      break;
    case Coll::alltoall:
      alltoall(e, c);
      break;
    case Coll::gather:
      gather(e, c);
      break;
    case Coll::scatter:
      scatter(e, c);
      break;
    case Coll::barrier:
      barrier(e, c);
      break;
    case Coll::sendrecv:
      if (c.is_send) {
        const SendOp op{c.peer, c.send, c.count() * c.esize()};
        e.exchange_n(c, &op, 1, nullptr, 0);
      } else {
        const RecvOp op{c.peer, c.recv, c.count() * c.esize()};
        e.exchange_n(c, nullptr, 0, &op, 1);
      }
      break;
  }
  return c.algo;
}

}  // namespace cohort::comm::detail
