// The one switch from a call's kind to the collective that runs it.
#include "collectives.h"

namespace cohort::comm::detail {

void run(Engine& e, const Call& c) {
  switch (c.desc.coll) {
    case Coll::allreduce:
      return allreduce(e, c);
    case Coll::reduce_scatter:
      return reduce_scatter(e, c);
    case Coll::allgather:
      return allgather(e, c);
    case Coll::broadcast:
      return broadcast(e, c);
    case Coll::reduce:
      return reduce(e, c);
    case Coll::alltoall:
      return alltoall(e, c);
    case Coll::gather:
      return gather(e, c);
    case Coll::scatter:
      return scatter(e, c);
    case Coll::barrier:
      return barrier(e, c);
    case Coll::sendrecv:
      if (c.is_send) {
        const SendOp op{c.peer, c.send, c.count() * c.esize()};
        return e.exchange_n(c, &op, 1, nullptr, 0);
      } else {
        const RecvOp op{c.peer, c.recv, c.count() * c.esize()};
        return e.exchange_n(c, nullptr, 0, &op, 1);
      }
  }
}

}  // namespace cohort::comm::detail
