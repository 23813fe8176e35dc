// Cohort's Mailbox (see communicator.h): tagged point-to-point messages on links of their own,
// moved by a thread of their own, so that every isend and irecv completes by itself whatever
// the order ranks post them in. Per peer, the outgoing stream carries the sends in the order
// posted; the incoming stream is read message by message: each header is matched against the
// receives posted (oldest first), and a message nobody waits for yet is held in memory until a
// receive takes it. Reading every arriving message is what keeps any order free of deadlock: a
// sender is never stuck behind a receiver that waits for something else.
#pragma once

#include <condition_variable>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/comm/store.h"
#include "cohort/core/clock.h"
#include "links.h"
#include "settings.h"
#include "transport/peer.h"
#include "wire.h"

namespace cohort::comm::detail {

class NativeMailbox final : public Mailbox {
 public:
  // Collective over `members`: connects links of its own through `store` (a namespace of its
  // own).
  NativeMailbox(Store store, const std::string& token, const std::string& name, int rank,
                const std::vector<PeerDesc>& members, const Settings& s);
  ~NativeMailbox() override;

  Work isend(const void* data, size_t bytes, int peer, int tag, Done done) override;
  Work irecv(void* data, size_t bytes, int peer, int tag, Done done) override;

 private:
  struct Op {
    bool send = false;
    int peer = kAnySource;
    int tag = 0;
    const uint8_t* src = nullptr;  // a send's bytes
    uint8_t* dst = nullptr;        // a receive's destination
    size_t bytes = 0;
    Clock::time_point deadline;
    std::shared_ptr<WorkState> work;  // null once its call has been answered
    Done done;
  };
  using OpPtr = std::shared_ptr<Op>;
  // A message that arrived before a receive for it: filled as it arrives, taken by the first
  // receive that matches (which may come while it still arrives).
  struct Held {
    int peer = 0;
    int tag = 0;
    std::vector<uint8_t> data;
    bool complete = false;
    OpPtr taker;
  };
  struct Outgoing {
    std::deque<OpPtr> queue;  // the head is on the wire once `started`
    bool started = false;
    uint8_t header[sizeof(wire::MsgHeader)];
    size_t header_done = 0;  // of the head's header
    size_t done = 0;         // payload bytes of the head out
    uint32_t sent = 0;       // messages numbered, for diagnostics
  };
  struct Incoming {
    uint8_t header[sizeof(wire::MsgHeader)];
    size_t header_done = 0;
    bool in_message = false;
    wire::MsgHeader h;
    size_t done = 0;
    OpPtr op;                        // the receive it lands in, or
    std::list<Held>::iterator held;  // where it is held, unless
    bool discard = false;            // its receive timed out part way: the rest is dropped
  };
  struct Peer {
    Link* link = nullptr;
    Outgoing out;
    Incoming in;
    std::string failed;  // why this peer can no longer be reached ("" while it can)
  };
  // A call that finished: answered outside the lock (its Done may take other locks).
  struct Answer {
    std::shared_ptr<WorkState> work;
    Done done;
    std::exception_ptr error;
    int source = -1;
  };

  // A call's state, its Work and its deadline (the buffer is the caller's to set).
  OpPtr make_op(bool send, int peer, int tag, size_t bytes, Done done) const;
  void progress_loop();
  // One pass over every link under mu_: returns whether any byte moved.
  bool pass(std::vector<Answer>& answers);
  bool pass_out(int p, std::vector<Answer>& answers);
  bool pass_in(int p, std::vector<Answer>& answers);
  // The first posted receive that takes a message from `peer` with `tag`, removed; or null.
  OpPtr match_posted(int peer, int tag);
  void expire(Clock::time_point now, std::vector<Answer>& answers);
  void check_peers(std::vector<Answer>& answers);
  // Fails every call with rank p, now and later: with CommError naming `why`, or with
  // TimeoutError carrying it as it is (a send cut part way by its timeout).
  void fail_peer(int p, const std::string& why, std::vector<Answer>& answers,
                 bool timed_out = false);
  void answer(const OpPtr& op, std::exception_ptr error, int source, std::vector<Answer>& answers);
  static void deliver(std::vector<Answer>& answers);
  bool pending() const;  // anything posted or in flight (caller holds mu_)
  std::string describe(const Op& op) const;

  int rank_;
  int size_;
  Settings settings_;
  LinkSet links_;
  std::vector<Peer> peers_;
  std::vector<uint8_t> drop_;  // where discarded payloads are read to

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<OpPtr> posted_;  // receives without a message yet, in posting order
  std::list<Held> held_;     // messages without a receive yet, in arrival order
  uint64_t calls_ = 0;  // isend and irecv calls: a sleeping progress thread wakes for a new one
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cohort::comm::detail
