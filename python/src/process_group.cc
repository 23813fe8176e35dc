// ProcessGroupCohort's calls: checks with messages that name the op and both sides of a mismatch,
// staging of tensors that are not contiguous, and the completion thread.
#include "process_group.h"

#include <Python.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "cohort/core/error.h"
#include "torch_store.h"

namespace cohort::python {

namespace {

using comm::DataType;

// How Cohort sees a tensor's elements. Ops that only move data take every dtype, as bytes.
struct Elements {
  DataType type;
  size_t count;
};

Elements elements(const at::Tensor& t, const char* op, bool reducing) {
  const auto n = static_cast<size_t>(t.numel());
  switch (t.scalar_type()) {
    case at::kFloat:
      return {DataType::f32, n};
    case at::kDouble:
      return {DataType::f64, n};
    case at::kHalf:
      return {DataType::f16, n};
    case at::kBFloat16:
      return {DataType::bf16, n};
    case at::kInt:
      return {DataType::i32, n};
    case at::kLong:
      return {DataType::i64, n};
    case at::kByte:
      return {DataType::u8, n};
    default:
      TORCH_CHECK(!reducing, "cohort: ", op, " cannot reduce ", t.scalar_type(),
                  " tensors; Cohort reduces float32, float64, float16, bfloat16, int32, int64 "
                  "and uint8");
      return {DataType::u8, n * t.element_size()};
  }
}

comm::RedOp redop(const c10d::ReduceOp& op, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return comm::RedOp::sum;
    case c10d::ReduceOp::AVG:
      return comm::RedOp::avg;
    case c10d::ReduceOp::PRODUCT:
      return comm::RedOp::prod;
    case c10d::ReduceOp::MIN:
      return comm::RedOp::min;
    case c10d::ReduceOp::MAX:
      return comm::RedOp::max;
    default:
      TORCH_CHECK(false, "cohort: ", name, " does not support ReduceOp ", static_cast<int>(op.op_),
                  " (BAND, BOR, BXOR or PREMUL_SUM); Cohort reduces with SUM, AVG, PRODUCT, MIN "
                  "and MAX");
  }
}

void check_tensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.device().is_cpu(), "cohort: ", op, " got a tensor on ", t.device(),
              "; this build of the cohort backend handles CPU tensors (use nccl for GPU tensors)");
  TORCH_CHECK(t.layout() == at::kStrided, "cohort: ", op, " got a ", t.layout(),
              " tensor; only dense tensors are supported");
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "cohort: ", op, " takes one tensor per process, got ", ts.size());
  check_tensor(ts[0], op);
  return ts[0];
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && a.numel() == b.numel(), "cohort: ", op, ": ",
              what, " has ", b.numel(), " ", b.scalar_type(), " elements, the input ", a.numel(),
              " ", a.scalar_type());
}

void check_root(int64_t root, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "cohort: ", op, ": root rank ", root,
              " is outside this group of ", size);
}

// Where Cohort writes: the tensor itself when contiguous, else a buffer that Pending::write_back
// copies back.
at::Tensor writable(const at::Tensor& t) {
  return t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
}

// Rows of a contiguous buffer of `blocks` equal blocks: block i as a flat view.
at::Tensor block(const at::Tensor& flat, int64_t i, int64_t n) {
  return flat.narrow(0, i * n, n);
}

// Cohort's call, with its error reported as the torch op's.
template <typename F>
comm::Work issue(const char* op, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cohort: ", op, ": ", e.what());
  }
}

// Every ProcessGroupCohort alive in this process, for drain_all(). Never destroyed: a group may
// outlive static destruction.
struct LiveGroups {
  std::mutex mu;
  std::set<ProcessGroupCohort*> groups;
};
LiveGroups& live_groups() {
  static auto* g = new LiveGroups;
  return *g;
}

// Releases the GIL for its lifetime where this thread holds it.
struct WithoutGil {
  PyThreadState* saved = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  WithoutGil() = default;
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;
  ~WithoutGil() {
    if (saved) PyEval_RestoreThread(saved);
  }
};

}  // namespace

CohortWork::CohortWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type), outputs_(std::move(outputs)) {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

int CohortWork::sourceRank() const {
  TORCH_CHECK(source_ >= 0, "cohort: the sender's rank is known once a receive has completed");
  return source_;
}

void CohortWork::complete(std::exception_ptr error) {
  finish(error);
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

ProcessGroupCohort::ProcessGroupCohort(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), timeout_(timeout) {
  comm::InitOptions opt;
  opt.timeout = timeout;
  try {
    comm_ = comm::join(comm::Store(std::make_shared<TorchStore>(store), timeout), rank, size, opt);
    mailbox_ = comm_->open_mailbox();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cohort: rank ", rank, " of ", size, " could not join: ", e.what());
  }
  completer_ = std::thread([this] { complete_in_order(); });
  p2p_completer_ = std::thread([this] { complete_p2p(); });
  std::lock_guard<std::mutex> lock(live_groups().mu);
  live_groups().groups.insert(this);
}

ProcessGroupCohort::~ProcessGroupCohort() {
  {
    std::lock_guard<std::mutex> lock(live_groups().mu);
    live_groups().groups.erase(this);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // Dropped from Python, a group is destroyed holding the GIL. The completion thread may need
  // it to release a tensor, and the communicator's closing barrier waits on the other ranks:
  // both run without it.
  WithoutGil nogil;
  completer_.join();  // every call issued completes or fails within the timeout
  {
    // Sends go out (each completes or fails within the timeout); receives nobody sends to are
    // not waited for, as gloo does not: the mailbox's closing cancels them.
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait_for(lock, timeout_ + std::chrono::seconds(5),
                      [&] { return mailbox_sends_ == 0; });
  }
  // The communicator's closing barrier first: once every rank is past it, every message that a
  // receive waits for has arrived.
  comm_.reset();
  close_mailbox();
  {
    std::lock_guard<std::mutex> lock(mu_);
    p2p_stopping_ = true;
  }
  p2p_cv_.notify_all();
  p2p_completer_.join();  // completes what the mailbox's closing answered
}

void ProcessGroupCohort::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  // Every call completes or fails within the timeout; the margin covers the copies back.
  idle_cv_.wait_for(lock, timeout_ + std::chrono::seconds(5), [&] {
    return pending_.empty() && !busy_ && mailbox_sends_ == 0 && p2p_done_.empty() && !p2p_busy_;
  });
}

void ProcessGroupCohort::drain_all() {
  std::lock_guard<std::mutex> lock(live_groups().mu);
  for (ProcessGroupCohort* g : live_groups().groups) {
    g->drain();
    g->close_mailbox();  // cancels receives nobody sent to
    g->drain();          // and completes their Works before Python finalizes
  }
}

std::shared_ptr<comm::Mailbox> ProcessGroupCohort::mailbox() {
  std::lock_guard<std::mutex> lock(mu_);
  return mailbox_;
}

void ProcessGroupCohort::close_mailbox() {
  std::shared_ptr<comm::Mailbox> box;
  {
    std::lock_guard<std::mutex> lock(mu_);
    box.swap(mailbox_);
  }
  box.reset();  // answers every call still posted (unless a call in progress holds it)
}

void ProcessGroupCohort::complete_p2p() {
  for (;;) {
    std::function<void()> done;
    {
      std::unique_lock<std::mutex> lock(mu_);
      p2p_busy_ = false;
      if (p2p_done_.empty()) idle_cv_.notify_all();
      p2p_cv_.wait(lock, [&] { return p2p_stopping_ || !p2p_done_.empty(); });
      if (p2p_done_.empty()) return;
      done = std::move(p2p_done_.front());
      p2p_done_.pop_front();
      p2p_busy_ = true;
    }
    done();  // completes a torch Work, whose Future may run callbacks: never on the mailbox's
             // thread, which they could wait on
  }
}

void ProcessGroupCohort::queue_p2p(std::function<void()> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    p2p_done_.push_back(std::move(done));
  }
  p2p_cv_.notify_one();
}

void ProcessGroupCohort::Pending::read_from(const at::Tensor& user, const at::Tensor& staged) {
  if (!user.is_same(staged)) keep.push_back(staged);
}

void ProcessGroupCohort::Pending::write_back(const at::Tensor& user, const at::Tensor& staged) {
  if (user.is_same(staged)) return;
  keep.push_back(staged);
  finish = [user, staged]() mutable { user.copy_(staged); };
}

ProcessGroupCohort::Work ProcessGroupCohort::submit(c10d::OpType type, Tensors outputs, Pending p) {
  p.work = c10::make_intrusive<CohortWork>(getRank(), type, std::move(outputs));
  Work w = p.work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(p));
  }
  cv_.notify_one();
  return w;
}

// Cohort runs calls in issue order, so waiting on the oldest first never waits needlessly.
void ProcessGroupCohort::complete_in_order() {
  for (;;) {
    Pending p;
    {
      // One lock per call: the previous call (released below) stops counting as held here.
      std::unique_lock<std::mutex> lock(mu_);
      busy_ = false;
      if (pending_.empty()) idle_cv_.notify_all();  // drain() waits for this
      cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;
      p = std::move(pending_.front());
      pending_.pop_front();
      busy_ = true;
    }
    std::exception_ptr error;
    try {
      for (auto& c : p.calls) c.wait();
      if (p.finish) p.finish();
    } catch (...) {
      error = std::current_exception();
    }
    p.keep.clear();
    p.work->complete(error);
    p = Pending{};  // the last references to tensors may be ours: release them before idling
  }
}

ProcessGroupCohort::Work ProcessGroupCohort::broadcast(Tensors& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  const char* op = "broadcast";
  at::Tensor t = single(tensors, op);
  check_root(opts.rootRank, getSize(), op);
  const Elements e = elements(t, op, false);
  at::Tensor b = t.contiguous();
  Pending p;
  p.calls.push_back(issue(op, [&] {
    return comm_->broadcast(b.data_ptr(), b.data_ptr(), e.count, e.type,
                            static_cast<int>(opts.rootRank));
  }));
  p.write_back(t, b);
  return submit(c10d::OpType::BROADCAST, {t}, std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::allreduce(Tensors& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  const char* op = "allreduce";
  at::Tensor t = single(tensors, op);
  const Elements e = elements(t, op, true);
  const comm::RedOp r = redop(opts.reduceOp, op);
  at::Tensor b = t.contiguous();
  Pending p;
  p.calls.push_back(
      issue(op, [&] { return comm_->allreduce(b.data_ptr(), b.data_ptr(), e.count, e.type, r); }));
  p.write_back(t, b);
  return submit(c10d::OpType::ALLREDUCE, {t}, std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::allreduce_coalesced(
    Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "allreduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "cohort: ", op, " got no tensors");
  for (const auto& t : tensors) {
    check_tensor(t, op);
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "cohort: ", op,
                " needs one dtype; got ", tensors[0].scalar_type(), " and ", t.scalar_type());
  }
  const comm::RedOp r = redop(opts.reduceOp, op);
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.reshape(-1));
  at::Tensor b = at::cat(flat);
  const Elements e = elements(b, op, true);
  Pending p;
  p.calls.push_back(
      issue(op, [&] { return comm_->allreduce(b.data_ptr(), b.data_ptr(), e.count, e.type, r); }));
  p.keep = {b};
  p.finish = [tensors, b]() mutable {
    int64_t at = 0;
    for (auto& t : tensors) {
      t.copy_(b.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  };
  return submit(c10d::OpType::ALLREDUCE_COALESCED, tensors, std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::reduce(Tensors& tensors,
                                                    const c10d::ReduceOptions& opts) {
  const char* op = "reduce";
  at::Tensor t = single(tensors, op);
  check_root(opts.rootRank, getSize(), op);
  const Elements e = elements(t, op, true);
  const comm::RedOp r = redop(opts.reduceOp, op);
  at::Tensor b = t.contiguous();
  const int root = static_cast<int>(opts.rootRank);
  Pending p;
  p.calls.push_back(issue(
      op, [&] { return comm_->reduce(b.data_ptr(), b.data_ptr(), e.count, e.type, r, root); }));
  if (getRank() == root) {
    p.write_back(t, b);
  } else {
    p.read_from(t, b);
  }
  return submit(c10d::OpType::REDUCE, {t}, std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::allgather(std::vector<Tensors>& outputs,
                                                       Tensors& inputs,
                                                       const c10d::AllgatherOptions&) {
  const char* op = "allgather";
  const at::Tensor& in = single(inputs, op);
  TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
              "cohort: ", op, " needs one list of ", getSize(), " output tensors");
  for (const auto& o : outputs[0]) {
    check_tensor(o, op);
    check_same(in, o, op, "an output tensor");
  }
  const Elements e = elements(in, op, false);
  at::Tensor src = in.contiguous();
  at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
  Pending p;
  p.calls.push_back(issue(
      op, [&] { return comm_->allgather(src.data_ptr(), flat.data_ptr(), e.count, e.type); }));
  p.read_from(in, src);
  p.keep.push_back(flat);
  Tensors outs = outputs[0];
  p.finish = [outs, flat, n = in.numel()]() mutable {
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i].copy_(block(flat, static_cast<int64_t>(i), n).view(outs[i].sizes()));
    }
  };
  return submit(c10d::OpType::ALLGATHER, outputs[0], std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions&) {
  const char* op = "allgather_into_tensor";
  check_tensor(input, op);
  check_tensor(output, op);
  TORCH_CHECK(
      output.scalar_type() == input.scalar_type() && output.numel() == getSize() * input.numel(),
      "cohort: ", op, ": the output has ", output.numel(), " ", output.scalar_type(),
      " elements; it needs ", getSize(), " x ", input.numel(), " ", input.scalar_type());
  const Elements e = elements(input, op, false);
  at::Tensor src = input.contiguous();
  at::Tensor dst = writable(output);
  Pending p;
  p.calls.push_back(
      issue(op, [&] { return comm_->allgather(src.data_ptr(), dst.data_ptr(), e.count, e.type); }));
  p.read_from(input, src);
  p.write_back(output, dst);
  return submit(c10d::OpType::_ALLGATHER_BASE, {output}, std::move(p));
}

// Every rank's list of tensors (of any sizes, empty ones too, the same list on every rank) as one
// allgather of their bytes, cut apart into the output lists.
ProcessGroupCohort::Work ProcessGroupCohort::allgather_coalesced(std::vector<Tensors>& outputs,
                                                                 Tensors& inputs,
                                                                 const c10d::AllgatherOptions&) {
  const char* op = "allgather_coalesced";
  const auto n = static_cast<size_t>(getSize());
  TORCH_CHECK(outputs.size() == n, "cohort: ", op, " needs ", n,
              " output lists (one per rank), got ", outputs.size());
  int64_t bytes = 0;
  std::vector<at::Tensor> rows;
  for (const auto& t : inputs) {
    check_tensor(t, op);
    rows.push_back(t.contiguous().reshape(-1).view(at::kByte));
    bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  for (size_t r = 0; r < n; ++r) {
    TORCH_CHECK(outputs[r].size() == inputs.size(), "cohort: ", op, ": output list ", r, " has ",
                outputs[r].size(), " tensors; the input list has ", inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_tensor(outputs[r][i], op);
      check_same(inputs[i], outputs[r][i], op, "an output tensor");
    }
  }
  at::Tensor src = rows.empty() ? at::empty({0}, at::kByte) : at::cat(rows);
  at::Tensor flat = at::empty({static_cast<int64_t>(n) * bytes}, at::kByte);
  Pending p;
  p.calls.push_back(issue(op, [&] {
    return comm_->allgather(src.data_ptr(), flat.data_ptr(), static_cast<size_t>(bytes),
                            DataType::u8);
  }));
  p.keep = {src, flat};
  Tensors all;
  for (const auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
  p.finish = [outputs, flat, bytes]() mutable {
    for (size_t r = 0; r < outputs.size(); ++r) {
      int64_t at = static_cast<int64_t>(r) * bytes;
      for (auto& o : outputs[r]) {
        // Bytes into bytes: a dtype view of `flat` at an offset that is no multiple of the
        // element size would be refused.
        const int64_t b = o.numel() * static_cast<int64_t>(o.element_size());
        at::Tensor dst = o.is_contiguous() ? o : at::empty_like(o, at::MemoryFormat::Contiguous);
        dst.view(-1).view(at::kByte).copy_(flat.narrow(0, at, b));
        if (!o.is_same(dst)) o.copy_(dst);
        at += b;
      }
    }
  };
  return submit(c10d::OpType::ALLGATHER_COALESCED, std::move(all), std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::gather(std::vector<Tensors>& outputs, Tensors& inputs,
                                                    const c10d::GatherOptions& opts) {
  const char* op = "gather";
  const at::Tensor& in = single(inputs, op);
  check_root(opts.rootRank, getSize(), op);
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = getRank() == root;
  Tensors outs;
  if (is_root) {
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
                "cohort: ", op, " needs one list of ", getSize(), " output tensors on the root");
    outs = outputs[0];
    for (const auto& o : outs) {
      check_tensor(o, op);
      check_same(in, o, op, "an output tensor");
    }
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "cohort: ", op, ": only the root (rank ",
                root, ") takes output tensors");
  }
  const Elements e = elements(in, op, false);
  at::Tensor src = in.contiguous();
  at::Tensor flat = is_root ? at::empty({getSize() * in.numel()}, in.options()) : at::Tensor();
  Pending p;
  p.calls.push_back(issue(op, [&] {
    return comm_->gather(src.data_ptr(), is_root ? flat.data_ptr() : nullptr, e.count, e.type,
                         root);
  }));
  p.read_from(in, src);
  if (is_root) {
    p.keep.push_back(flat);
    p.finish = [outs, flat, n = in.numel()]() mutable {
      for (size_t i = 0; i < outs.size(); ++i) {
        outs[i].copy_(block(flat, static_cast<int64_t>(i), n).view(outs[i].sizes()));
      }
    };
  }
  return submit(c10d::OpType::GATHER, outs, std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  const char* op = "scatter";
  at::Tensor out = single(outputs, op);
  check_root(opts.rootRank, getSize(), op);
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = getRank() == root;
  at::Tensor flat;
  if (is_root) {
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
                "cohort: ", op, " needs one list of ", getSize(), " input tensors on the root");
    std::vector<at::Tensor> rows;
    for (const auto& i : inputs[0]) {
      check_tensor(i, op);
      check_same(out, i, op, "an input tensor");
      rows.push_back(i.reshape(-1));
    }
    flat = at::cat(rows);
  } else {
    TORCH_CHECK(inputs.empty() || inputs[0].empty(), "cohort: ", op, ": only the root (rank ", root,
                ") takes input tensors");
  }
  const Elements e = elements(out, op, false);
  at::Tensor dst = writable(out);
  Pending p;
  p.calls.push_back(issue(op, [&] {
    return comm_->scatter(is_root ? flat.data_ptr() : nullptr, dst.data_ptr(), e.count, e.type,
                          root);
  }));
  p.write_back(out, dst);
  if (is_root) p.keep.push_back(flat);
  return submit(c10d::OpType::SCATTER, {out}, std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::reduce_scatter(
    Tensors& outputs, std::vector<Tensors>& inputs, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  at::Tensor out = single(outputs, op);
  TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
              "cohort: ", op, " needs one list of ", getSize(), " input tensors");
  std::vector<at::Tensor> rows;
  for (const auto& i : inputs[0]) {
    check_tensor(i, op);
    check_same(out, i, op, "an input tensor");
    rows.push_back(i.reshape(-1));
  }
  const Elements e = elements(out, op, true);
  const comm::RedOp r = redop(opts.reduceOp, op);
  at::Tensor flat = at::cat(rows);
  at::Tensor dst = writable(out);
  Pending p;
  p.calls.push_back(issue(op, [&] {
    return comm_->reduce_scatter(flat.data_ptr(), dst.data_ptr(), e.count, e.type, r);
  }));
  p.keep = {flat};
  p.write_back(out, dst);
  return submit(c10d::OpType::REDUCE_SCATTER, {out}, std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  check_tensor(input, op);
  check_tensor(output, op);
  TORCH_CHECK(
      output.scalar_type() == input.scalar_type() && input.numel() == getSize() * output.numel(),
      "cohort: ", op, ": the input has ", input.numel(), " ", input.scalar_type(),
      " elements; it needs ", getSize(), " x ", output.numel(), " ", output.scalar_type());
  const Elements e = elements(output, op, true);
  const comm::RedOp r = redop(opts.reduceOp, op);
  at::Tensor src = input.contiguous();
  at::Tensor dst = writable(output);
  Pending p;
  p.calls.push_back(issue(op, [&] {
    return comm_->reduce_scatter(src.data_ptr(), dst.data_ptr(), e.count, e.type, r);
  }));
  p.read_from(input, src);
  p.write_back(output, dst);
  return submit(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, std::move(p));
}

// The blocks differ per peer: every rank learns the largest block of the whole exchange (one
// 8-byte allreduce, waited on here), sends blocks padded to it, and keeps each received block's
// head. Costs up to size x the largest block; equal splits take the direct path.
ProcessGroupCohort::Work ProcessGroupCohort::padded_alltoall(
    const char* op, c10d::OpType type, Tensors outputs, const std::vector<at::Tensor>& send_blocks,
    const std::vector<at::Tensor>& recv_blocks) {
  const int n = getSize();
  const at::ScalarType dtype = send_blocks.at(0).scalar_type();
  int64_t largest = 0;
  for (const auto& b : send_blocks) largest = std::max(largest, b.numel());
  for (const auto& b : recv_blocks) largest = std::max(largest, b.numel());
  issue(op, [&] {
    auto w = comm_->allreduce(&largest, &largest, 1, DataType::i64, comm::RedOp::max);
    w.wait();
    return w;
  });
  at::Tensor sendbuf = at::zeros({n * largest}, at::TensorOptions().dtype(dtype));
  for (int j = 0; j < n; ++j) {
    const auto& b = send_blocks[static_cast<size_t>(j)];
    sendbuf.narrow(0, j * largest, b.numel()).copy_(b.reshape(-1));
  }
  at::Tensor recvbuf = at::empty({n * largest}, at::TensorOptions().dtype(dtype));
  const Elements e = elements(block(sendbuf, 0, largest), op, false);
  Pending p;
  p.calls.push_back(issue(op, [&] {
    return comm_->alltoall(sendbuf.data_ptr(), recvbuf.data_ptr(), e.count, e.type);
  }));
  p.keep = {sendbuf, recvbuf};
  p.finish = [recv_blocks, recvbuf, largest]() mutable {
    for (size_t i = 0; i < recv_blocks.size(); ++i) {
      auto& dst = recv_blocks[i];
      dst.copy_(
          recvbuf.narrow(0, static_cast<int64_t>(i) * largest, dst.numel()).view(dst.sizes()));
    }
  };
  return submit(type, std::move(outputs), std::move(p));
}

ProcessGroupCohort::Work ProcessGroupCohort::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_splits,
                                                           std::vector<int64_t>& input_splits,
                                                           const c10d::AllToAllOptions&) {
  const char* op = "alltoall_base";
  check_tensor(input, op);
  check_tensor(output, op);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "cohort: ", op, ": the output is ",
              output.scalar_type(), ", the input ", input.scalar_type());
  const int n = getSize();
  if (output_splits.empty() && input_splits.empty()) {
    TORCH_CHECK(input.numel() == output.numel() && input.numel() % n == 0, "cohort: ", op,
                ": equal splits need input and output of one size divisible by ", n, "; got ",
                input.numel(), " and ", output.numel());
    const Elements e = elements(input, op, false);
    at::Tensor src = input.contiguous();
    at::Tensor dst = writable(output);
    Pending p;
    p.calls.push_back(issue(op, [&] {
      return comm_->alltoall(src.data_ptr(), dst.data_ptr(), e.count / static_cast<size_t>(n),
                             e.type);
    }));
    p.read_from(input, src);
    p.write_back(output, dst);
    return submit(c10d::OpType::ALLTOALL_BASE, {output}, std::move(p));
  }
  // Splits count rows along dim 0; an empty list means equal rows.
  auto cut = [&](const at::Tensor& t, std::vector<int64_t> splits, const char* side) {
    TORCH_CHECK(t.dim() >= 1, "cohort: ", op, ": the ", side, " tensor has no dim 0 to split");
    if (splits.empty()) {
      TORCH_CHECK(t.size(0) % n == 0, "cohort: ", op, ": the ", side, " tensor's ", t.size(0),
                  " rows do not split evenly into ", n);
      splits.assign(static_cast<size_t>(n), t.size(0) / n);
    }
    TORCH_CHECK(splits.size() == static_cast<size_t>(n), "cohort: ", op, ": ", splits.size(), " ",
                side, " splits for a group of ", n);
    int64_t rows = 0;
    for (int64_t s : splits) rows += s;
    TORCH_CHECK(rows == t.size(0), "cohort: ", op, ": the ", side, " splits sum to ", rows,
                " rows; the tensor has ", t.size(0));
    std::vector<at::Tensor> blocks;
    int64_t at = 0;
    for (int64_t s : splits) {
      blocks.push_back(t.narrow(0, at, s));
      at += s;
    }
    return blocks;
  };
  return padded_alltoall(op, c10d::OpType::ALLTOALL_BASE, {output},
                         cut(input, input_splits, "input"), cut(output, output_splits, "output"));
}

ProcessGroupCohort::Work ProcessGroupCohort::alltoall(Tensors& outputs, Tensors& inputs,
                                                      const c10d::AllToAllOptions&) {
  const char* op = "alltoall";
  const auto n = static_cast<size_t>(getSize());
  TORCH_CHECK(outputs.size() == n && inputs.size() == n, "cohort: ", op, " needs ", n,
              " input and ", n, " output tensors; got ", inputs.size(), " and ", outputs.size());
  for (const auto* list : {&inputs, &outputs}) {
    for (const auto& t : *list) {
      check_tensor(t, op);
      TORCH_CHECK(t.scalar_type() == inputs[0].scalar_type(), "cohort: ", op,
                  " needs one dtype; got ", inputs[0].scalar_type(), " and ", t.scalar_type());
    }
  }
  return padded_alltoall(op, c10d::OpType::ALLTOALL, outputs, inputs, outputs);
}

// Through the mailbox: a message matches the receive with its tag (from its sender or from any
// rank), in the order sent, and each call completes by itself. The mailbox's Done hands the
// call to the group's point-to-point completion thread, which copies a receive into a tensor
// that was not contiguous, completes the torch Work and releases the tensors.
ProcessGroupCohort::Work ProcessGroupCohort::send(Tensors& tensors, int dst_rank, int tag) {
  const char* op = "send";
  const at::Tensor& t = single(tensors, op);
  check_root(dst_rank, getSize(), op);
  TORCH_CHECK(dst_rank != getRank(), "cohort: send: rank ", dst_rank, " is this rank itself");
  std::shared_ptr<comm::Mailbox> box = mailbox();
  TORCH_CHECK(box, "cohort: send: the group is shut down");
  at::Tensor src = t.contiguous();
  auto work = c10::make_intrusive<CohortWork>(getRank(), c10d::OpType::SEND, Tensors{t});
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++mailbox_sends_;
  }
  try {
    box->isend(src.data_ptr(), static_cast<size_t>(src.nbytes()), dst_rank, tag,
               [this, work, src](const comm::Work& done) {
                 queue_p2p([this, work, src, done]() mutable {
                   std::exception_ptr error;
                   try {
                     comm::Work(done).wait();
                   } catch (...) {
                     error = std::current_exception();
                   }
                   src = at::Tensor();
                   work->complete(error);
                   std::lock_guard<std::mutex> lock(mu_);
                   --mailbox_sends_;
                 });
               });
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    --mailbox_sends_;
    TORCH_CHECK(false, "cohort: ", op, ": ", e.what());
  }
  return work;
}

ProcessGroupCohort::Work ProcessGroupCohort::mailbox_recv(const char* op, c10d::OpType type,
                                                          Tensors& tensors, int src_rank, int tag) {
  at::Tensor t = single(tensors, op);
  std::shared_ptr<comm::Mailbox> box = mailbox();
  TORCH_CHECK(box, "cohort: ", op, ": the group is shut down");
  at::Tensor dst = writable(t);
  auto work = c10::make_intrusive<CohortWork>(getRank(), type, Tensors{t});
  try {
    box->irecv(dst.data_ptr(), static_cast<size_t>(dst.nbytes()), src_rank, tag,
               [this, work, t, dst](const comm::Work& done) {
                 queue_p2p([work, t, dst, done]() mutable {
                   std::exception_ptr error;
                   try {
                     comm::Work(done).wait();
                     if (!t.is_same(dst)) t.copy_(dst);
                     work->set_source(done.source());
                   } catch (...) {
                     error = std::current_exception();
                   }
                   t = at::Tensor();
                   dst = at::Tensor();
                   work->complete(error);
                 });
               });
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cohort: ", op, ": ", e.what());
  }
  return work;
}

ProcessGroupCohort::Work ProcessGroupCohort::recv(Tensors& tensors, int src_rank, int tag) {
  check_root(src_rank, getSize(), "recv");
  TORCH_CHECK(src_rank != getRank(), "cohort: recv: rank ", src_rank, " is this rank itself");
  return mailbox_recv("recv", c10d::OpType::RECV, tensors, src_rank, tag);
}

ProcessGroupCohort::Work ProcessGroupCohort::recvAnysource(Tensors& tensors, int tag) {
  return mailbox_recv("recv from any source", c10d::OpType::RECVANYSOURCE, tensors,
                      comm::kAnySource, tag);
}

ProcessGroupCohort::Work ProcessGroupCohort::barrier(const c10d::BarrierOptions&) {
  Pending p;
  p.calls.push_back(issue("barrier", [&] { return comm_->barrier(); }));
  return submit(c10d::OpType::BARRIER, {}, std::move(p));
}

}  // namespace cohort::python
