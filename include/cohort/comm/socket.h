// Thin RAII and deadline helpers over POSIX TCP sockets, shared by the store and the TCP transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/core/clock.h"

namespace cohort::comm {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void close();

  // Blocking-with-deadline helpers (the socket itself may be non-blocking).
  void write_all(const void* data, size_t n, Clock::time_point deadline, const std::string& peer);
  void read_all(void* data, size_t n, Clock::time_point deadline, const std::string& peer);

 private:
  int fd_ = -1;
};

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};
Endpoint parse_endpoint(const std::string& text, uint16_t default_port);  // "host[:port]"

// Listens on host:port (port 0: ephemeral). A port in use is an error naming it.
Socket listen_tcp(const std::string& host, uint16_t port, int backlog = 128);
uint16_t local_port(const Socket& s);
// Connects, retrying refused/unreachable until the deadline; the error names the endpoint.
Socket connect_tcp(const Endpoint& ep, Clock::time_point deadline, const std::string& what);
Socket accept_tcp(const Socket& listener, Clock::time_point deadline);
// One connection attempt: does a process listen at ep (open), is its host up with no process
// there (refused: the host answered with a reset), or does nothing answer within `wait`
// (silent: a host that is down, or a link that is cut, which cannot be told apart)?
enum class Reach { open, refused, silent };
Reach probe_tcp(const Endpoint& ep, std::chrono::milliseconds wait);
// The local address this host would use to reach `peer_host` (no packet is sent).
std::string local_address_towards(const std::string& peer_host);

void set_nonblocking(int fd, bool on);
void set_nodelay(int fd);
void set_buffers(int fd, int bytes);

}  // namespace cohort::comm
