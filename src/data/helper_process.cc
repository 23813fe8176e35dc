// The helper process (see helper_process.h): starting it, the request and reply on its socket,
// telling its death or overrun apart from an ordinary error, and its serving loop.
#include "helper_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/data/image.h"

extern char** environ;

namespace cohort::data {

namespace {

struct RequestHeader {
  uint64_t name_bytes = 0, bytes = 0;
};
struct ReplyHeader {
  uint8_t ok = 0;
  uint8_t pad[7] = {};
  uint64_t head = 0, body = 0;
};

// All of [p, p + n) written or read; false when the other side is gone.
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

class Helper {
 public:
  ~Helper() { stop(false); }

  HelperReply ask(const std::string& path, const std::string& name, std::span<const uint8_t> bytes,
                  double timeout_s) {
    if (pid_ < 0) start(path, name);
    const RequestHeader rq{name.size(), bytes.size()};
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    if (!write_all(sock_, &rq, sizeof rq) || !write_all(sock_, name.data(), name.size()) ||
        !write_all(sock_, bytes.data(), bytes.size())) {
      died(name, false, timeout_s);
    }
    ReplyHeader rp;
    if (!read_until(&rp, sizeof rp, deadline)) died(name, true, timeout_s);
    HelperReply r;
    r.ok = rp.ok == 0;
    r.head.resize(rp.head);
    r.body.resize(rp.body);
    if (!read_until(r.head.data(), r.head.size(), deadline) ||
        !read_until(r.body.data(), r.body.size(), deadline)) {
      died(name, true, timeout_s);
    }
    drain_stderr();
    return r;
  }

 private:
  void start(const std::string& path, const std::string& name) {
    int sv[2], err[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      COHORT_THROW_AS(DecodeError,
                      name << ": socketpair for the decoding helper: " << errno_string(errno));
    }
    if (::pipe2(err, O_CLOEXEC) != 0) {
      const int e = errno;
      ::close(sv[0]);
      ::close(sv[1]);
      COHORT_THROW_AS(DecodeError, name << ": pipe for the decoding helper: " << errno_string(e));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 0);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);  // nothing else of ours (sockets, files)
    char* argv[] = {const_cast<char*>(path.c_str()), nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, path.c_str(), &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(sv[1]);
    ::close(err[1]);
    if (rc != 0) {
      ::close(sv[0]);
      ::close(err[0]);
      // Not the file's fault, and every such file would fail alike: not a DecodeError (which
      // the pipeline counts and skips), so that the run stops and says why.
      throw std::runtime_error("cannot start the decoding helper " + path + " for " + name + ": " +
                               errno_string(rc) +
                               " (COHORT_GDCM_HELPER names another; 'off' decodes in this "
                               "process)");
    }
    pid_ = pid;
    sock_ = sv[0];
    err_ = err[0];
    ::fcntl(err_, F_SETFL, O_NONBLOCK);
  }

  // Reads n bytes before the deadline; false when the helper closed its end or the time ran out
  // (overran_ says which).
  template <class Deadline>
  bool read_until(void* p, size_t n, Deadline deadline) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        overran_ = true;
        return false;
      }
      pollfd pf{sock_, POLLIN, 0};
      const int k = ::poll(&pf, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (k < 0 && errno != EINTR) return false;
      if (k <= 0) continue;
      const ssize_t got = ::read(sock_, c, n);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      c += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }

  std::string drain_stderr() {
    std::string text;
    char buf[4096];
    for (;;) {
      const ssize_t k = ::read(err_, buf, sizeof buf);
      if (k <= 0) break;
      text.append(buf, static_cast<size_t>(k));
      if (text.size() > 65536) text.erase(0, text.size() - 4096);
    }
    return text;
  }

  // The helper is gone or stuck: stop it, and say what happened, naming the file.
  [[noreturn]] void died(const std::string& name, bool replying, double timeout_s) {
    const bool overran = overran_;
    const int status = stop(overran);
    std::string last = last_words_;
    while (!last.empty() && (last.back() == '\n' || last.back() == '\r')) last.pop_back();
    if (const size_t nl = last.rfind('\n'); nl != std::string::npos) last = last.substr(nl + 1);
    std::ostringstream what;
    if (overran) {
      what << "decoding took longer than " << timeout_s
           << " s (COHORT_DECODE_TIMEOUT); its helper process was stopped";
    } else if (WIFSIGNALED(status)) {
      what << "the decoder died with signal " << WTERMSIG(status) << " ("
           << strsignal(WTERMSIG(status)) << ") " << (replying ? "while decoding it" : "before");
    } else {
      what << "the decoder exited with status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1)
           << " while decoding it";
    }
    if (!last.empty()) what << ": " << last;
    what << " (in a helper process: this one goes on)";
    COHORT_THROW_AS(DecodeError, name << ": " << what.str());
  }

  // Closes the socket (the helper ends at EOF), kills it first when asked, and reaps it.
  // Returns its wait status.
  int stop(bool kill_first) {
    int status = 0;
    last_words_.clear();
    if (pid_ > 0) {
      if (kill_first) ::kill(pid_, SIGKILL);
      ::close(sock_);
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      last_words_ = drain_stderr();
      ::close(err_);
    }
    pid_ = -1;
    sock_ = err_ = -1;
    overran_ = false;
    return status;
  }

  pid_t pid_ = -1;
  int sock_ = -1, err_ = -1;
  bool overran_ = false;
  std::string last_words_;
};

}  // namespace

HelperReply ask_helper(const std::string& path, const std::string& name,
                       std::span<const uint8_t> bytes, double timeout_s) {
  thread_local Helper helper;
  return helper.ask(path, name, bytes, timeout_s);
}

int serve_helper(const HelperHandler& handle) {
  // Ends with the thread that started it, even one killed without a chance to close the socket.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 0;
  std::vector<uint8_t> bytes;  // kept from request to request: its pages stay mapped
  for (;;) {
    RequestHeader rq;
    if (!read_all(0, &rq, sizeof rq)) return 0;  // the caller closed its end
    std::string name(rq.name_bytes, '\0');
    bytes.resize(rq.bytes);
    if (!read_all(0, name.data(), name.size()) || !read_all(0, bytes.data(), bytes.size())) {
      return 0;
    }
    ReplyHeader rp;
    HelperResult out;
    try {
      out = handle(std::span<const uint8_t>(bytes.data(), rq.bytes), name);
    } catch (const Error& e) {
      rp.ok = 1;
      out = {e.message(), {}};
    } catch (const std::exception& e) {
      rp.ok = 1;
      out = {name + ": " + e.what(), {}};
    }
    rp.head = out.head.size();
    rp.body = out.body.size();
    if (!write_all(1, &rp, sizeof rp) || !write_all(1, out.head.data(), out.head.size()) ||
        !write_all(1, out.body.data(), out.body.size())) {
      return 0;
    }
  }
}

}  // namespace cohort::data
