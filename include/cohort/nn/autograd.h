// Reverse-mode autograd over a tape. Each op, while a Tape is recording, pushes the closure that
// back-propagates it; Tape::backward runs them in reverse and frees what each one held as it
// goes. Parameters live in one flat buffer per model (Param::value and ::grad are views into it);
// when the last use of a parameter in this step has been back-propagated, its gradient is final
// and the tape fires the grad-ready hooks (what DDP's overlapped bucket allreduce listens to).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/core/clock.h"
#include "cohort/tensor/tensor.h"

namespace cohort::nn {

using tensor::DType;
using tensor::Shape;
using tensor::Tensor;

class Residency;

struct Param {
  std::string name;  // torchvision's name, e.g. "layer1.0.conv1.weight"
  Shape shape;
  Tensor value, grad;              // views into the model's flat buffers (or into a sharded
                                   // engine's buffer while its unit is in use)
  bool decay = true;               // false for norm weights and biases (optimisers may exempt them)
  size_t offset = 0;               // in elements, into the flat buffers
  int index = 0;                   // registration order
  int pending = 0;                 // uses recorded in this forward, not yet back-propagated
  Residency* residency = nullptr;  // set when the value is sharded (see below)
};

// Where a sharded parameter's value comes from (ZeRO-3, FSDP): told before every read of
// Param::value by a layer's forward or backward, so that the value can be gathered first. Null
// (the default): the value is always in place.
class Residency {
 public:
  virtual ~Residency() = default;
  virtual void need(Param& p) = 0;
};
inline void need_value(Param& p) {
  if (p.residency) p.residency->need(p);
}

// An activation. Parameters are not nodes: the op that uses one adds to Param::grad itself.
struct Node {
  Tensor value;
  Tensor grad;  // undefined until some gradient arrives
  bool requires_grad = false;
};
using Var = std::shared_ptr<Node>;

Var constant(Tensor t);  // an input, or an op's result

class Tape {
 public:
  using Hook = std::function<void(Param&)>;
  Tape() = default;
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // Makes this the thread's recording tape for the guard's lifetime.
  class Recording {
   public:
    explicit Recording(Tape& t);
    ~Recording();

   private:
    Tape* prev_;
  };

  // The tape ops record onto, or null (no tape, or inside NoGrad).
  static Tape* current();

  // `out` is the op's result: once its closure has run, its gradient is dropped.
  void push(const Var& out, std::function<void()> backward);
  void use(Param& p);
  // After an op's backward added to p.grad: fires the hooks when that was p's last use.
  void param_done(Param& p);

  void on_grad_ready(Hook h) { hooks_.push_back(std::move(h)); }
  // Off: this tape counts no parameter uses and fires no hooks, so that several tapes may be
  // recorded before any is back-propagated (a pipeline stage's micro-batches in flight).
  void track_uses(bool on) { track_ = on; }
  void clear_hooks() { hooks_.clear(); }
  // Seeds d(loss)/d(loss) = seed and runs every recorded closure in reverse, then clears.
  // A parameter whose uses got no gradient (an unused branch) is reported ready at the end,
  // with its gradient unchanged, so that whoever waits on every parameter never hangs.
  void backward(const Var& loss, float seed = 1.0f);
  // Back-propagates from a recorded output whose gradient is `grad` (a pipeline stage's output,
  // with the gradient the next stage sent back), then clears.
  void backward_from(const Var& out, Tensor grad);
  void clear();
  size_t size() const { return ops_.size(); }

 private:
  struct Op {
    Var out;
    std::function<void()> backward;
  };
  std::vector<Op> ops_;
  std::vector<Hook> hooks_;
  std::vector<Param*> used_;  // parameters used in this forward, in first-use order
  bool track_ = true;

  void run_backward();
};

// The tape's per-op timeline (`cohort bench train --profile FILE`): while on, the k-th op a step
// records adds to entry k the time of the profile scope it was recorded in (its forward) and the
// time of its backward closure, summed over the steps run. Its kind is that scope's name
// ("conv.fwd"; empty for an op recorded outside any scope).
namespace timeline {
struct OpTime {
  std::string kind;
  double forward = 0, backward = 0;  // seconds, summed over steps
};
void enable(bool on);
bool enabled();
void reset();
std::vector<OpTime> entries();
int steps();  // backward passes since reset

// For nn::profile::Scope: opening one names the ops recorded inside it; closing it returns the
// op recorded inside (-1 if none), which gets the scope's time as its forward.
struct Scope {
  const char* kind = nullptr;
  long recorded = -1;
};
Scope open_scope(const char* kind);  // returns the outer scope's state
long close_scope(const Scope& outer);
void add_forward(long op, double seconds);
}  // namespace timeline

// Inside this scope ops record nothing (evaluation, the optimiser step).
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();

 private:
  Tape* prev_;
};

// True when ops should record (a tape is current and x needs a gradient).
bool recording(const Var& x);

// Adds g to n's gradient. g must not be held by anyone else unless the caller passes it here
// for several nodes (a sum's backward): a shared gradient is never updated in place.
void accumulate(Node& n, Tensor g);

}  // namespace cohort::nn
