// A model: a module tree plus its parameters laid out in one flat f32 value buffer and one
// flat gradient buffer (each parameter 64-byte aligned inside them), in registration order.
// Flat buffers are what DDP buckets and ZeRO shards slice; the per-layer tensors are views.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/nn/module.h"

namespace cohort::nn {

// The padding rule of the flat buffers, in one place: a parameter of n elements occupies a slot
// of n rounded up to 16 floats (64 bytes), so that every parameter starts 64-byte aligned. DDP
// buckets (and shards) cover whole slots.
inline size_t flat_slot(size_t numel) {
  return (numel + 15) & ~size_t{15};
}

// A unit: the grain of sharding (FSDP's wrapped module, one ZeRO-3 gather): one block of the
// network (a ResNet BasicBlock or Bottleneck, a DenseNet dense layer or transition) or a run of
// parameters outside blocks (the stem, the head). Parameters [first, last) in registration
// order, which is also the order forward uses them; elements [begin, end) of the flat buffers.
struct Unit {
  std::string name;
  int first = 0, last = 0;
  size_t begin = 0, end = 0;
};

struct ModelOptions {
  int in_channels = 3;  // 1 for grayscale scans
  int num_classes = 1000;
  int image_size = 224;  // the small CNN sizes its classifier from it
  uint64_t seed = 0;
};

class Model {
 public:
  // is_unit(name) says which modules are units (see Unit); null: the whole model is one.
  Model(std::string name, std::unique_ptr<Module> root, const ModelOptions& o,
        const std::function<bool(const std::string&)>& is_unit = {});

  Var forward(const Var& x) { return root_->forward(x); }
  void train(bool on) { root_->train(on); }
  bool is_training() const { return root_->is_training(); }
  void zero_grad() { grads_.zero_(); }

  const std::string& name() const { return name_; }
  const ModelOptions& options() const { return opt_; }
  const std::vector<Param*>& params() const { return params_; }
  const std::vector<Buffer*>& buffers() const { return buffers_; }
  Param* find_param(const std::string& name) const;
  Buffer* find_buffer(const std::string& name) const;
  int64_t num_parameters() const;  // elements, without alignment padding
  Tensor& flat_values() { return values_; }
  Tensor& flat_grads() { return grads_; }
  const std::vector<Unit>& units() const { return units_; }
  // The model as a chain of pieces (Module::chain) with their parameter ranges; empty when the
  // network cannot be cut (pipeline parallelism needs it).
  const std::vector<Piece>& pieces() const { return pieces_; }
  // Lays the flat buffers out again so that every unit starts and ends on a multiple of `align`
  // elements (zero padding between), keeping the values: ZeRO splits each unit into equal
  // chunks, one per rank. New buffers (gradients zero); the Params' views follow.
  void align_units(size_t align);
  // Moves the flat gradients (values) into `storage` (the caller's, at least flat_grads().bytes(),
  // kept alive while the model uses it), keeping them; the Params' views follow. DDP and ZeRO-1
  // place them in memory that the ranks of a host read from each other.
  void place_grads(void* storage);
  void place_values(void* storage);
  Module& root() { return *root_; }

  // Re-runs torchvision's initialisation from a seed.
  void reset_parameters(uint64_t seed);

 private:
  std::string name_;
  std::unique_ptr<Module> root_;
  ModelOptions opt_;
  std::vector<Param*> params_;
  std::vector<Buffer*> buffers_;
  std::vector<Unit> units_;
  std::vector<Piece> pieces_;
  Tensor values_, grads_;
};

// resnet18/34/50/101/152, densenet121, smallcnn. Throws naming the known names otherwise.
std::unique_ptr<Model> make_model(const std::string& name, const ModelOptions& o);
std::vector<std::string> model_names();

}  // namespace cohort::nn
