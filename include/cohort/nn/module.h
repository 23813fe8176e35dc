// Modules: a tree of layers with torchvision's names. Parameters are declared with their shape
// while the tree is built; Model (model.h) then lays them out in one flat value buffer and one
// flat gradient buffer, in registration order, and each Param becomes a view.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/nn/autograd.h"

namespace cohort::nn {

// State that is saved with the weights but not trained (BatchNorm's running statistics).
struct Buffer {
  std::string name;
  Tensor value;
};

// One link of a model cut into a chain (pipeline stages are runs of links): what the composition
// of every piece's forward, in order, computes is the model's forward. `modules` are the full
// dotted names of the modules whose parameters the piece uses; Model fills in [first, last),
// those parameters in registration order.
struct Piece {
  std::string name;
  std::vector<std::string> modules;
  std::function<Var(const Var&)> forward;
  int first = 0, last = 0;
};

class Module {
 public:
  virtual ~Module() = default;
  virtual Var forward(const Var& x) = 0;
  // torchvision's initialisation for this module's own parameters; seed is per module.
  virtual void reset_parameters(uint64_t /*seed*/) {}
  // The module as a chain of pieces at block boundaries (pipeline parallelism cuts between
  // them); empty: it cannot be cut.
  virtual std::vector<Piece> chain() { return {}; }

  void train(bool on);
  bool is_training() const { return training_; }

  // Every parameter and buffer below this module, with full dotted names, in registration
  // order (children in the order they were added, a module's own before its children's).
  void collect(const std::string& prefix, std::vector<Param*>* params,
               std::vector<Buffer*>* buffers);
  // Every module below this one (this one first), with full names.
  void modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>* out);

 protected:
  Param& add_param(const std::string& name, Shape shape, bool decay = true);
  Buffer& add_buffer(const std::string& name, Tensor value);
  template <class M>
  M& add(const std::string& name, std::unique_ptr<M> m) {
    M& ref = *m;
    children_.emplace_back(name, std::move(m));
    return ref;
  }
  bool training_ = true;

 private:
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

// Children named "0", "1", ... run in order.
class Sequential : public Module {
 public:
  template <class M>
  M& append(std::unique_ptr<M> m) {
    M& ref = add(std::to_string(size_), std::move(m));
    order_.push_back(&ref);
    size_++;
    return ref;
  }
  template <class M>
  M& append_named(const std::string& name, std::unique_ptr<M> m) {
    M& ref = add(name, std::move(m));
    order_.push_back(&ref);
    size_++;
    return ref;
  }
  Var forward(const Var& x) override;
  int size() const { return size_; }
  Module& at(int i) { return *order_[static_cast<size_t>(i)]; }

 private:
  std::vector<Module*> order_;
  int size_ = 0;
};

}  // namespace cohort::nn
