#include "shm_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "cohort/core/error.h"

namespace cohort::comm {

namespace {

constexpr uint64_t kSegMagic = 0x434f484f52545348ull;  // "COHORTSH"

struct alignas(64) RingCtl {
  alignas(64) std::atomic<uint64_t> head;  // bytes written by the producer
  alignas(64) std::atomic<uint64_t> tail;  // bytes consumed by the consumer
  alignas(64) std::atomic<uint32_t> aborted;
  char reason[256];
};

struct SegHeader {
  uint64_t magic;
  uint64_t ring_bytes;
  RingCtl ring[2];  // ring[0]: low rank -> high rank; ring[1]: high -> low
};

size_t segment_size(size_t ring_bytes) {
  size_t hdr = (sizeof(SegHeader) + 4095) & ~size_t(4095);
  return hdr + 2 * ring_bytes;
}

class ShmLink final : public Link {
 public:
  ShmLink(void* base, size_t map_bytes, bool low, PeerDesc peer)
      : base_(base), map_bytes_(map_bytes), peer_(std::move(peer)) {
    auto* h = static_cast<SegHeader*>(base);
    ring_bytes_ = h->ring_bytes;
    mask_ = ring_bytes_ - 1;
    size_t hdr = (sizeof(SegHeader) + 4095) & ~size_t(4095);
    auto* data = static_cast<uint8_t*>(base) + hdr;
    out_ = &h->ring[low ? 0 : 1];
    in_ = &h->ring[low ? 1 : 0];
    out_data_ = data + (low ? 0 : ring_bytes_);
    in_data_ = data + (low ? ring_bytes_ : 0);
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, peer_.pid, 0));
  }

  ~ShmLink() override {
    if (pidfd_ >= 0) ::close(pidfd_);
    ::munmap(base_, map_bytes_);
  }

  // The counters live on cache lines the peer also touches: each side keeps private copies
  // and reads or publishes the shared ones only when it must, so that a small message costs
  // few cross-core transfers.
  size_t send_some(const void* data, size_t n) override {
    size_t free_bytes = ring_bytes_ - static_cast<size_t>(head_ - peer_tail_);
    if (free_bytes < n) {
      peer_tail_ = out_->tail.load(std::memory_order_acquire);
      free_bytes = ring_bytes_ - static_cast<size_t>(head_ - peer_tail_);
    }
    size_t pos = head_ & mask_;
    size_t k = std::min({n, free_bytes, ring_bytes_ - pos});
    if (k == 0) return 0;
    std::memcpy(out_data_ + pos, data, k);
    head_ += k;
    out_->head.store(head_, std::memory_order_release);
    return k;
  }

  // At most two spans: before and after the wrap.
  size_t recv_into(void* dst, size_t n) override { return copy_spans(dst, n); }

  size_t peek(void* dst, size_t n) override {
    uint64_t head = in_->head.load(std::memory_order_acquire);
    size_t k = std::min<size_t>(n, head - tail_);
    for (size_t i = 0; i < k; ++i) static_cast<uint8_t*>(dst)[i] = in_data_[(tail_ + i) & mask_];
    return k;
  }

  void flush() override {
    if (tail_ != tail_published_) {
      in_->tail.store(tail_, std::memory_order_release);
      tail_published_ = tail_;
    }
  }

  void check_peer() override {
    if (in_->aborted.load(std::memory_order_acquire) ||
        out_->aborted.load(std::memory_order_acquire)) {
      std::string why(in_->reason, strnlen(in_->reason, sizeof(in_->reason)));
      COHORT_THROW_AS(CommError, peer_.name() << " aborted the communicator: " << why);
    }
    bool dead = false;
    if (pidfd_ >= 0) {
      pollfd pfd{pidfd_, POLLIN, 0};
      dead = ::poll(&pfd, 1, 0) == 1;
    } else {
      dead = ::kill(peer_.pid, 0) != 0 && errno == ESRCH;
    }
    if (dead) {
      COHORT_THROW_AS(CommError, peer_.name() << " died (process " << peer_.pid
                                              << " exited) during a collective");
    }
  }

  void abort(const std::string& reason) override {
    // Our outgoing ring's reason is what the peer reads as in_->reason.
    size_t n = std::min(reason.size(), sizeof(out_->reason) - 1);
    std::memcpy(out_->reason, reason.data(), n);
    out_->reason[n] = '\0';
    out_->aborted.store(1, std::memory_order_release);
  }

  const char* kind() const override { return "shm"; }

 protected:
  size_t peek_span(size_t n, const uint8_t** p) override {
    if (peer_head_ == tail_) peer_head_ = in_->head.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(peer_head_ - tail_);
    size_t pos = tail_ & mask_;
    size_t k = std::min({n, avail, ring_bytes_ - pos});
    *p = in_data_ + pos;
    return k;
  }

  void release(size_t n) override {
    tail_ += n;
    // Publish consumption in batches; the engine flushes the rest whenever it goes idle.
    if (tail_ - tail_published_ >= ring_bytes_ / 4) flush();
  }

 private:
  void* base_;
  size_t map_bytes_;
  PeerDesc peer_;
  size_t ring_bytes_ = 0;
  size_t mask_ = 0;
  RingCtl* out_ = nullptr;
  RingCtl* in_ = nullptr;
  uint8_t* out_data_ = nullptr;
  uint8_t* in_data_ = nullptr;
  int pidfd_ = -1;
  uint64_t head_ = 0;            // our outgoing head (published at once)
  uint64_t peer_tail_ = 0;       // last seen consumer position of our outgoing ring
  uint64_t tail_ = 0;            // our consumption of the incoming ring
  uint64_t tail_published_ = 0;  // what the producer has been told
  uint64_t peer_head_ = 0;       // last seen producer position of the incoming ring
};

void* map_fd(int fd, size_t bytes, const std::string& name) {
  // MAP_POPULATE faults every page in now: a first pass through the rings would otherwise pay
  // one page fault per 4 KiB inside the first collectives.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    COHORT_THROW_AS(CommError, "mmap of shared-memory segment "
                                   << name << " (" << bytes << " bytes): " << errno_string(errno));
  }
  return p;
}

}  // namespace

std::string shm_job_prefix(const std::string& token) {
  return "cohort-" + token.substr(0, 16);
}

std::unique_ptr<Link> connect_shm(Store& store, const ShmOptions& opt, const PeerDesc& me,
                                  const PeerDesc& peer) {
  size_t ring = opt.ring_bytes;
  COHORT_CHECK(ring >= 4096 && (ring & (ring - 1)) == 0,
               "shared-memory ring size must be a power of two >= 4096, got " << ring);
  const bool low = me.rank < peer.rank;
  const int a = std::min(me.rank, peer.rank), b = std::max(me.rank, peer.rank);
  const std::string name = opt.name_prefix + "-" + std::to_string(a) + "-" + std::to_string(b);
  const std::string key = "shm" + name;  // unique per segment, so a pair may open several
  const size_t bytes = segment_size(ring);
  void* base = nullptr;
  if (low) {
    int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      COHORT_THROW_AS(CommError, "shm_open(" << name << ") failed: " << errno_string(errno)
                                             << " (is /dev/shm mounted and writable?)");
    }
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int e = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      COHORT_THROW_AS(CommError, "cannot size shared-memory segment "
                                     << name << " to " << bytes << " bytes: " << errno_string(e));
    }
    base = map_fd(fd, bytes, name);
    ::close(fd);
    // Write every page once now: in a virtual machine the first write to a page can cost far
    // more than a fault, and the first collectives would pay it page by page.
    std::memset(base, 0, bytes);
    auto* h = static_cast<SegHeader*>(base);
    h->ring_bytes = ring;
    for (auto& r : h->ring) {
      new (&r) RingCtl();
      r.head.store(0);
      r.tail.store(0);
      r.aborted.store(0);
      r.reason[0] = '\0';
    }
    std::atomic_thread_fence(std::memory_order_release);
    h->magic = kSegMagic;
    try {
      store.set(key, name);
      store.get(key + "/attached");
    } catch (...) {
      ::shm_unlink(name.c_str());
      ::munmap(base, bytes);
      throw;
    }
    ::shm_unlink(name.c_str());  // both sides hold a mapping; the name is no longer needed
  } else {
    std::string got = store.get(key);
    int fd = ::shm_open(got.c_str(), O_RDWR, 0600);
    if (fd < 0) {
      COHORT_THROW_AS(CommError, "cannot open shared-memory segment "
                                     << got << " created by " << peer.name() << ": "
                                     << errno_string(errno)
                                     << " (are both ranks on one "
                                        "host? set COHORT_HOST_ID)");
    }
    base = map_fd(fd, bytes, got);
    ::close(fd);
    auto* h = static_cast<SegHeader*>(base);
    if (h->magic != kSegMagic || h->ring_bytes != ring) {
      ::munmap(base, bytes);
      COHORT_THROW_AS(CommError, "shared-memory segment " << got << " from " << peer.name()
                                                          << " has ring size " << h->ring_bytes
                                                          << ", this rank expects " << ring
                                                          << " (COHORT_SHM_RING_BYTES differs?)");
    }
    // Touch the rings from this side too before the peer may use them (see the creator).
    const size_t hdr = (sizeof(SegHeader) + 4095) & ~size_t(4095);
    std::memset(static_cast<uint8_t*>(base) + hdr, 0, bytes - hdr);
    store.set(key + "/attached", "1");
  }
  return std::make_unique<ShmLink>(base, bytes, low, peer);
}

}  // namespace cohort::comm
