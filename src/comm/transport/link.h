// The transport interface, internal to comm (users call the Communicator). Like NCCL's network
// plugin, a transport only moves bytes: one Link is an ordered, reliable byte stream in each
// direction between this rank and one peer, driven by non-blocking calls (the engine's progress
// loop is the `test`). Framing, matching and reduction live above it, once, for every transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace cohort::comm {

class Link {
 public:
  virtual ~Link() = default;

  // Takes up to n bytes into the outgoing stream without blocking; returns how many it took.
  // Most transports copy them. One that sends them from where they are (registered memory and
  // RDMA, no staging copy) reports false from sends_complete() while it still reads them: the
  // engine keeps them unchanged until then.
  virtual size_t send_some(const void* data, size_t n) = 0;
  virtual bool sends_complete() { return true; }

  // Moves up to n arrived bytes into dst without blocking; returns how many.
  virtual size_t recv_into(void* dst, size_t n) = 0;

  // Hands up to n arrived bytes to `sink` as contiguous spans that live only during the call,
  // so that a reduction can read them where they landed (the shared-memory ring, a staging
  // buffer) instead of copying first. Returns the bytes consumed; sink consumes all it gets.
  template <typename Sink>
  size_t recv_with(size_t n, Sink&& sink) {
    const uint8_t* p = nullptr;
    size_t got = peek_span(n, &p);
    if (got == 0) return 0;
    sink(p, got);
    release(got);
    return got;
  }

  // Makes consumption visible to the sender (a transport may publish it lazily); the engine
  // calls it whenever it stops making progress and at the end of each exchange.
  virtual void flush() {}

  // Copies up to n arrived bytes without consuming them (for mismatch diagnosis).
  virtual size_t peek(void* dst, size_t n) = 0;

  // Throws CommError naming the peer if it is known to be gone or has aborted.
  virtual void check_peer() = 0;
  // Makes the peer's pending and future waits on this link fail promptly.
  virtual void abort(const std::string& reason) = 0;
  // A file descriptor that becomes readable when data arrives, for poll() while idle; -1 if none.
  virtual int wait_fd() const { return -1; }
  virtual const char* kind() const = 0;

 protected:
  // A contiguous span of up to n arrived bytes (may be fewer); 0 when nothing has arrived.
  virtual size_t peek_span(size_t n, const uint8_t** p) = 0;
  virtual void release(size_t n) = 0;

  // recv_into for transports whose data arrives in their own buffers: copies span by span.
  size_t copy_spans(void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const uint8_t* p = nullptr;
      const size_t k = peek_span(n - done, &p);
      if (k == 0) break;
      std::memcpy(static_cast<uint8_t*>(dst) + done, p, k);
      release(k);
      done += k;
    }
    return done;
  }
};

}  // namespace cohort::comm
