// What TCP over loopback allows on this machine, with no collective on top: the floor that any
// 2-rank allreduce over TCP (Cohort's, Gloo's, Open MPI's) runs against.
//   - both ways: two processes, pinned to a core each, each sending BYTES to the other while
//     receiving BYTES from it (a sender thread and a receiver thread each, blocking calls in
//     4 MiB pieces). A 2-rank allreduce of S bytes sends and receives S on each rank, so its
//     bus bandwidth cannot pass this per-direction rate.
//   - one way: half a 16-byte ping-pong's round trip, the receiver spinning on a non-blocking
//     recv (no wake-up cost; spinning on poll() instead was 8.3-8.6 us against 7.6-7.7), the
//     median of 20000. An allreduce's latency is at least one hop.
// Usage: tcp_floor BYTES ROUNDS OUT.json   (the best of ROUNDS for both ways)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kPiece = 4u << 20;

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

void pin(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core % static_cast<int>(std::thread::hardware_concurrency()), &set);
  sched_setaffinity(0, sizeof(set), &set);
}

void send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) die("send");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void recv_all(int fd, char* p, size_t n, bool spin = false) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, spin ? MSG_DONTWAIT : 0);
    if (r < 0 && spin && errno == EAGAIN) continue;
    if (r <= 0) die("recv");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// Seconds for BYTES each way at once, this side's view; both sides start at a 1-byte handshake.
double both_ways(int fd, size_t bytes, std::vector<char>& out, std::vector<char>& in) {
  char b = 0;
  send_all(fd, &b, 1);
  recv_all(fd, &b, 1);
  const auto t0 = Clock::now();
  std::thread sender([&] {
    for (size_t done = 0; done < bytes; done += kPiece) {
      send_all(fd, out.data(), std::min(kPiece, bytes - done));
    }
  });
  for (size_t done = 0; done < bytes; done += kPiece) {
    recv_all(fd, in.data(), std::min(kPiece, bytes - done));
  }
  sender.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The median one-way time in microseconds; `first` sends first.
double one_way_us(int fd, bool first) {
  char msg[16] = {};
  std::vector<double> t;
  for (int i = 0; i < 21000; ++i) {
    const auto t0 = Clock::now();
    if (first) {
      send_all(fd, msg, sizeof(msg));
      recv_all(fd, msg, sizeof(msg), true);
    } else {
      recv_all(fd, msg, sizeof(msg), true);
      send_all(fd, msg, sizeof(msg));
    }
    if (i >= 1000)
      t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
  return t[t.size() / 2] / 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: tcp_floor BYTES ROUNDS OUT.json\n");
    return 2;
  }
  const size_t bytes = std::strtoull(argv[1], nullptr, 10);
  const int rounds = std::atoi(argv[2]);
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(lfd, 1) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    die("listen on 127.0.0.1");
  }
  const pid_t child = ::fork();
  if (child < 0) die("fork");
  const bool parent = child != 0;
  // Each side bounded in time whatever the other does (fork does not pass the alarm on): a stuck
  // or vanished side ends both, by SIGALRM and then a closed connection, where a spinning or
  // blocking call would otherwise wait for ever.
  ::alarm(120);
  int fd = -1;
  if (parent) {
    fd = ::accept(lfd, nullptr, nullptr);
  } else {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("connect");
  }
  ::close(lfd);
  if (fd < 0) die("accept");
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  pin(parent ? 0 : 1);
  std::vector<char> out(kPiece, 1), in(kPiece);
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const double mine = both_ways(fd, bytes, out, in);
    double theirs = 0;  // the slower side sets the rate
    send_all(fd, reinterpret_cast<const char*>(&mine), sizeof(mine));
    recv_all(fd, reinterpret_cast<char*>(&theirs), sizeof(theirs));
    best = std::min(best, std::max(mine, theirs));
  }
  const double lat = one_way_us(fd, parent);
  ::close(fd);
  if (!parent) return 0;
  int status = 0;
  ::waitpid(child, &status, 0);
  FILE* f = std::fopen(argv[3], "w");
  if (f == nullptr) die(argv[3]);
  std::fprintf(f,
               "{\"bytes\": %zu, \"rounds\": %d, \"both_ways_gbps\": %.4f, \"one_way_us\": %.3f}\n",
               bytes, rounds, bytes / best / 1e9, lat);
  std::fclose(f);
  std::printf("tcp loopback: %.3f GB/s each way at once, %.2f us one way\n", bytes / best / 1e9,
              lat);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
