#include "ucx_transport.h"

#include <signal.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "cohort/core/error.h"

namespace cohort::comm {

namespace {

std::string hex_of(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = static_cast<const uint8_t*>(p)[i];
    s[2 * i] = d[b >> 4];
    s[2 * i + 1] = d[b & 15];
  }
  return s;
}

std::vector<uint8_t> bytes_of(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

void check(ucs_status_t s, const char* what) {
  if (s != UCS_OK) COHORT_THROW_AS(CommError, "UCX " << what << ": " << ucs_status_string(s));
}

}  // namespace

class UcxWorker {
 public:
  UcxWorker() {
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "config");
    // Without RDMA devices UCX runs over tcp or shared memory, where its rendezvous protocol
    // gains no zero-copy and costs a handshake per message, a round trip through the link's
    // queue: 0.78 of Cohort's TCP on two emulated hosts at 1 Gbit/s, eager alone 1.00. With
    // RDMA, rendezvous is the zero-copy RDMA path and stays UCX's choice. UCX_RNDV_THRESH wins.
    if (std::getenv("UCX_RNDV_THRESH") == nullptr && !ucx_has_rdma()) {
      ucp_config_modify(config, "RNDV_THRESH", "inf");
    }
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_TAG;
    const ucs_status_t s = ucp_init(&p, config, &ctx_);
    ucp_config_release(config);
    check(s, "init (UCX_TLS / UCX_NET_DEVICES?)");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // Calls run one at a time, but abort() may come from another thread.
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    check(ucp_worker_create(ctx_, &wp, &worker_), "worker");
    ucp_address_t* a = nullptr;
    size_t n = 0;
    check(ucp_worker_get_address(worker_, &a, &n), "worker address");
    address_.assign(reinterpret_cast<uint8_t*>(a), reinterpret_cast<uint8_t*>(a) + n);
    ucp_worker_release_address(worker_, a);
  }
  ~UcxWorker() {
    ucp_worker_destroy(worker_);
    ucp_cleanup(ctx_);
  }
  ucp_worker_h worker() const { return worker_; }
  const std::vector<uint8_t>& address() const { return address_; }
  void progress() {
    while (ucp_worker_progress(worker_) != 0) {
    }
  }

 private:
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<uint8_t> address_;
};

namespace {

class UcxLink final : public Link {
 public:
  UcxLink(std::shared_ptr<UcxWorker> w, const std::vector<uint8_t>& remote, PeerDesc peer,
          bool same_host, uint64_t send_tag, uint64_t recv_tag, const UcxOptions& o)
      : w_(std::move(w)),
        peer_(std::move(peer)),
        send_tag_(send_tag),
        recv_tag_(recv_tag),
        chunk_(o.chunk_bytes) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(remote.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxLink::on_error;
    ep.err_handler.arg = this;
    ucs_status_t st = ucp_ep_create(w_->worker(), &ep, &ep_);
    if (st == UCS_ERR_UNREACHABLE && same_host) {
      // UCX's shared-memory transports report no peer failures; a dead peer on this host is
      // then seen through its pid.
      ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      st = ucp_ep_create(w_->worker(), &ep, &ep_);
      watch_pid_ = true;
    }
    check(st, "endpoint");
    sends_.resize(static_cast<size_t>(o.chunks));
    for (int i = 0; i < o.chunks; ++i) {
      recvs_.emplace_back();
      recvs_.back().buf.resize(chunk_);
      post(recvs_.back());
    }
  }

  ~UcxLink() override {
    for (auto& r : recvs_) {
      if (r.req) {
        ucp_request_cancel(w_->worker(), r.req);
        ucp_request_free(r.req);
      }
    }
    for (auto& s : sends_) {
      if (s.req) {
        ucp_request_cancel(w_->worker(), s.req);
        ucp_request_free(s.req);
      }
    }
    close();
  }

  // Straight from the caller's memory: UCX registers it (and keeps the registration cached),
  // so on InfiniBand and RoCE the NIC reads it by RDMA with no staging copy on this side.
  size_t send_some(const void* data, size_t n) override {
    if (n == 0) return 0;
    check_peer();
    w_->progress();
    Send& s = sends_[next_send_];
    if (s.req) {
      if (ucp_request_check_status(s.req) == UCS_INPROGRESS) return 0;
      finish_send(s);
    }
    const size_t m = std::min(n, chunk_);
    ucp_request_param_t p{};
    void* req = ucp_tag_send_nbx(ep_, data, m, send_tag_, &p);
    if (UCS_PTR_IS_ERR(req)) fail(UCS_PTR_STATUS(req));
    s.req = UCS_PTR_IS_PTR(req) ? req : nullptr;
    next_send_ = (next_send_ + 1) % sends_.size();
    return m;
  }

  bool sends_complete() override {
    check_peer();
    w_->progress();
    for (auto& s : sends_) {
      if (!s.req) continue;
      if (ucp_request_check_status(s.req) == UCS_INPROGRESS) return false;
      finish_send(s);
    }
    return true;
  }

  size_t recv_into(void* dst, size_t n) override { return copy_spans(dst, n); }

  size_t peek(void* dst, size_t n) override {
    w_->progress();
    size_t done = 0;
    for (auto& r : recvs_) {
      if (!ready(r) || done == n) break;
      const size_t k = std::min(n - done, r.len - r.off);
      std::memcpy(static_cast<uint8_t*>(dst) + done, r.buf.data() + r.off, k);
      done += k;
    }
    return done;
  }

  void check_peer() override {
    if (watch_pid_ && failed_ == UCS_OK && ::kill(peer_.pid, 0) != 0 && errno == ESRCH) {
      failed_ = UCS_ERR_CONNECTION_RESET;
    }
    if (failed_ != UCS_OK) {
      COHORT_THROW_AS(CommError,
                      "UCX link to " << peer_.name() << " failed: " << ucs_status_string(failed_));
    }
  }

  void abort(const std::string&) override {
    // Closing the endpoint breaks the peer's side too, so its waits fail promptly.
    if (failed_ == UCS_OK) failed_ = UCS_ERR_CANCELED;
    close();
  }

  const char* kind() const override { return "ucx"; }

 protected:
  size_t peek_span(size_t n, const uint8_t** p) override {
    check_peer();
    w_->progress();
    Recv& r = recvs_.front();
    if (!ready(r)) return 0;
    *p = r.buf.data() + r.off;
    return std::min(n, r.len - r.off);
  }

  void release(size_t n) override {
    Recv& r = recvs_.front();
    r.off += n;
    if (r.off < r.len) return;
    // Consumed: post it again at the back, keeping the receives in stream order.
    Recv done = std::move(recvs_.front());
    recvs_.pop_front();
    recvs_.push_back(std::move(done));
    post(recvs_.back());
  }

 private:
  struct Send {
    void* req = nullptr;  // in flight; its bytes are the caller's
  };
  struct Recv {
    std::vector<uint8_t> buf;
    void* req = nullptr;
    bool done = false;
    size_t len = 0, off = 0;
  };

  void close() {
    if (!ep_) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep_, &p);
    ep_ = nullptr;
    if (UCS_PTR_IS_PTR(req)) {
      // Bounded: a forced close completes locally.
      for (int i = 0; i < 100000 && ucp_request_check_status(req) == UCS_INPROGRESS; ++i)
        ucp_worker_progress(w_->worker());
      ucp_request_free(req);
    }
  }

  static void on_error(void* arg, ucp_ep_h, ucs_status_t status) {
    static_cast<UcxLink*>(arg)->failed_ = status;
  }

  [[noreturn]] void fail(ucs_status_t s) {
    failed_ = s;
    COHORT_THROW_AS(CommError,
                    "UCX link to " << peer_.name() << " failed: " << ucs_status_string(s));
  }

  void finish_send(Send& s) {
    const ucs_status_t st = ucp_request_check_status(s.req);
    ucp_request_free(s.req);
    s.req = nullptr;
    if (st != UCS_OK) fail(st);
  }

  void post(Recv& r) {
    r.done = false;
    r.len = r.off = 0;
    // Always a request (never completed in place), so that the length comes from one place:
    // ucp_tag_recv_request_test.
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void* req =
        ucp_tag_recv_nbx(w_->worker(), r.buf.data(), r.buf.size(), recv_tag_, ~uint64_t{0}, &p);
    if (UCS_PTR_IS_ERR(req)) fail(UCS_PTR_STATUS(req));
    r.req = req;
  }

  bool ready(Recv& r) {
    if (r.done) return true;
    if (!r.req) return false;
    ucp_tag_recv_info_t info{};
    const ucs_status_t st = ucp_tag_recv_request_test(r.req, &info);
    if (st == UCS_INPROGRESS) return false;
    ucp_request_free(r.req);
    r.req = nullptr;
    if (st != UCS_OK) fail(st);
    r.done = true;
    r.len = info.length;
    return true;
  }

  std::shared_ptr<UcxWorker> w_;
  PeerDesc peer_;
  uint64_t send_tag_, recv_tag_;
  size_t chunk_;
  ucp_ep_h ep_ = nullptr;
  std::vector<Send> sends_;
  size_t next_send_ = 0;
  std::deque<Recv> recvs_;
  volatile ucs_status_t failed_ = UCS_OK;
  bool watch_pid_ = false;
};

// Tag: 32 bits of the communicator id, 16 of the sender, 16 of the receiver.
uint64_t tag_of(uint64_t comm_id, int from, int to) {
  return (comm_id << 32) | (static_cast<uint64_t>(from & 0xffff) << 16) |
         static_cast<uint64_t>(to & 0xffff);
}

struct Hello {
  char token[48];
  int32_t rank;
};

}  // namespace

std::map<int, std::unique_ptr<Link>> connect_ucx_peers(Store& store, const UcxOptions& opt,
                                                       const PeerDesc& me,
                                                       const std::vector<PeerDesc>& peers) {
  auto worker = std::make_shared<UcxWorker>();
  store.set("ucx/" + std::to_string(me.rank),
            hex_of(worker->address().data(), worker->address().size()));
  std::map<int, std::unique_ptr<Link>> links;
  for (const PeerDesc& p : peers) {
    const std::vector<uint8_t> remote = bytes_of(store.get("ucx/" + std::to_string(p.rank)));
    links[p.rank] = std::make_unique<UcxLink>(worker, remote, p, p.host == me.host,
                                              tag_of(opt.comm_id, me.rank, p.rank),
                                              tag_of(opt.comm_id, p.rank, me.rank), opt);
  }
  // Every link opens with the job token: data from anyone else is refused.
  Hello mine{};
  std::strncpy(mine.token, opt.token.c_str(), sizeof(mine.token) - 1);
  mine.rank = me.rank;
  for (auto& [rank, l] : links) {
    size_t sent = 0;
    while (sent < sizeof(mine)) {
      sent += l->send_some(reinterpret_cast<const uint8_t*>(&mine) + sent, sizeof(mine) - sent);
      if (Clock::now() > opt.deadline) COHORT_THROW_AS(TimeoutError, "UCX hello to rank " << rank);
    }
  }
  // `mine` is sent in place: it must outlive the sends.
  for (auto& [rank, l] : links) {
    while (!l->sends_complete()) {
      if (Clock::now() > opt.deadline) COHORT_THROW_AS(TimeoutError, "UCX hello to rank " << rank);
      std::this_thread::yield();
    }
  }
  for (auto& [rank, l] : links) {
    Hello theirs{};
    size_t got = 0;
    while (got < sizeof(theirs)) {
      got += l->recv_into(reinterpret_cast<uint8_t*>(&theirs) + got, sizeof(theirs) - got);
      if (got < sizeof(theirs)) {
        if (Clock::now() > opt.deadline)
          COHORT_THROW_AS(TimeoutError, "UCX hello from rank " << rank << " never came");
        std::this_thread::yield();
      }
    }
    if (std::strncmp(theirs.token, mine.token, sizeof(mine.token)) != 0 || theirs.rank != rank) {
      COHORT_THROW_AS(CommError, "UCX link from rank " << rank << " presented the wrong job token");
    }
  }
  return links;
}

std::vector<std::string> ucx_rdma_devices() {
  // UCX's own view, through its transport layer: the InfiniBand component lists one memory
  // domain per RDMA device (InfiniBand or RoCE) that its verbs library can open.
  std::vector<std::string> names;
  uct_component_h* comps = nullptr;
  unsigned n = 0;
  if (uct_query_components(&comps, &n) != UCS_OK) return names;
  for (unsigned i = 0; i < n; ++i) {
    uct_component_attr_t a{};
    a.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(comps[i], &a) != UCS_OK || std::strcmp(a.name, "ib") != 0) continue;
    std::vector<uct_md_resource_desc_t> mds(a.md_resource_count);
    a.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    a.md_resources = mds.data();
    if (mds.empty() || uct_component_query(comps[i], &a) != UCS_OK) continue;
    for (const auto& md : mds) names.emplace_back(md.md_name);
  }
  uct_release_component_list(comps);
  return names;
}

bool ucx_has_rdma() {
  return !ucx_rdma_devices().empty();
}

}  // namespace cohort::comm
