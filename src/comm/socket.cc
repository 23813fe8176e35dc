#include "cohort/comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "cohort/core/error.h"

namespace cohort::comm {

namespace {
int ms_left(Clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1000));
}

sockaddr_storage resolve(const std::string& host, uint16_t port, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0)
    COHORT_THROW_AS(CommError, "cannot resolve host '" << host << "': " << gai_strerror(rc));
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return ss;
}
}  // namespace

Socket::~Socket() {
  close();
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::write_all(const void* data, size_t n, Clock::time_point deadline,
                       const std::string& peer) {
  auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      COHORT_THROW_AS(CommError, "send to " << peer << " failed: " << errno_string(errno));
    }
    if (Clock::now() >= deadline) COHORT_THROW_AS(TimeoutError, "send to " << peer << " timed out");
    pollfd pfd{fd_, POLLOUT, 0};
    ::poll(&pfd, 1, ms_left(deadline));
  }
}

void Socket::read_all(void* data, size_t n, Clock::time_point deadline, const std::string& peer) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd_, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) COHORT_THROW_AS(CommError, peer << " closed the connection");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      COHORT_THROW_AS(CommError, "receive from " << peer << " failed: " << errno_string(errno));
    }
    if (Clock::now() >= deadline) {
      COHORT_THROW_AS(TimeoutError, "receive from " << peer << " timed out");
    }
    pollfd pfd{fd_, POLLIN, 0};
    ::poll(&pfd, 1, ms_left(deadline));
  }
}

Endpoint parse_endpoint(const std::string& text, uint16_t default_port) {
  Endpoint ep;
  auto colon = text.rfind(':');
  const bool bare_ipv6 = text.front() == '[' && text.find(']') > colon;
  if (colon == std::string::npos || bare_ipv6) {
    ep.host = text;
    ep.port = default_port;
  } else {
    ep.host = text.substr(0, colon);
    std::string p = text.substr(colon + 1);
    char* end = nullptr;
    long v = std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || v < 0 || v > 65535) {
      COHORT_THROW("'" << text << "' is not HOST:PORT (port must be 0..65535)");
    }
    ep.port = static_cast<uint16_t>(v);
  }
  if (ep.host.size() > 2 && ep.host.front() == '[') ep.host = ep.host.substr(1, ep.host.size() - 2);
  if (ep.host.empty()) COHORT_THROW("'" << text << "' has no host");
  return ep;
}

Socket listen_tcp(const std::string& host, uint16_t port, int backlog) {
  socklen_t len = 0;
  sockaddr_storage ss = resolve(host, port, &len);
  Socket s(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) COHORT_THROW_AS(CommError, "socket(): " << errno_string(errno));
  int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    int e = errno;
    if (e == EADDRINUSE) {
      COHORT_THROW_AS(CommError, "port " << port << " on " << host
                                         << " is already in use (choose another with --master "
                                            "HOST:PORT or MASTER_PORT)");
    }
    COHORT_THROW_AS(CommError, "bind " << host << ":" << port << ": " << errno_string(e));
  }
  if (::listen(s.fd(), backlog) != 0) {
    COHORT_THROW_AS(CommError, "listen " << host << ":" << port << ": " << errno_string(errno));
  }
  return s;
}

uint16_t local_port(const Socket& s) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&ss), &len);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

Socket connect_tcp(const Endpoint& ep, Clock::time_point deadline, const std::string& what) {
  int last_err = 0;
  auto backoff = std::chrono::milliseconds(5);
  while (true) {
    socklen_t len = 0;
    sockaddr_storage ss = resolve(ep.host, ep.port, &len);
    Socket s(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) COHORT_THROW_AS(CommError, "socket(): " << errno_string(errno));
    set_nonblocking(s.fd(), true);
    int rc = ::connect(s.fd(), reinterpret_cast<sockaddr*>(&ss), len);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{s.fd(), POLLOUT, 0};
      int pr = ::poll(&pfd, 1, ms_left(deadline));
      if (pr == 1) {
        int err = 0;
        socklen_t el = sizeof(err);
        ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &el);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        rc = -1;
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) return s;
    last_err = errno;
    if (Clock::now() >= deadline) {
      COHORT_THROW_AS(TimeoutError, "could not connect to "
                                        << what << " at " << ep.str()
                                        << " before the timeout: " << errno_string(last_err));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

Socket accept_tcp(const Socket& listener, Clock::time_point deadline) {
  while (true) {
    pollfd pfd{listener.fd(), POLLIN, 0};
    int pr = ::poll(&pfd, 1, ms_left(deadline));
    if (pr == 1) {
      int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) return Socket(fd);
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        COHORT_THROW_AS(CommError, "accept: " << errno_string(errno));
      }
    }
    if (Clock::now() >= deadline)
      COHORT_THROW_AS(TimeoutError, "timed out waiting for peers to connect");
  }
}

Reach probe_tcp(const Endpoint& ep, std::chrono::milliseconds wait) {
  socklen_t len = 0;
  sockaddr_storage ss = resolve(ep.host, ep.port, &len);
  Socket s(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Reach::silent;
  set_nonblocking(s.fd(), true);
  int rc = ::connect(s.fd(), reinterpret_cast<sockaddr*>(&ss), len);
  int err = rc == 0 ? 0 : errno;
  if (rc != 0 && err == EINPROGRESS) {
    pollfd pfd{s.fd(), POLLOUT, 0};
    if (::poll(&pfd, 1, static_cast<int>(wait.count())) != 1) return Reach::silent;
    socklen_t el = sizeof(err);
    ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &el);
  }
  if (err == 0) return Reach::open;
  return err == ECONNREFUSED ? Reach::refused : Reach::silent;
}

std::string local_address_towards(const std::string& peer_host) {
  socklen_t len = 0;
  sockaddr_storage ss = resolve(peer_host, 9, &len);
  int fd = ::socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "127.0.0.1";
  std::string out = "127.0.0.1";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0) {
    sockaddr_storage me{};
    socklen_t ml = sizeof(me);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &ml) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      if (me.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&me)->sin_addr, buf, sizeof(buf));
      } else {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&me)->sin6_addr, buf, sizeof(buf));
      }
      out = buf;
    }
  }
  ::close(fd);
  return out;
}

void set_nonblocking(int fd, bool on) {
  int fl = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void set_buffers(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

}  // namespace cohort::comm
