// Models by name, in torchvision's layout and with its parameter names, so that weights
// exchanged as safetensors load on either side.
#include <algorithm>
#include <functional>
#include <map>

#include "cohort/core/hash.h"
#include "cohort/core/rng.h"
#include "cohort/nn/layers.h"
#include "cohort/nn/model.h"

namespace cohort::nn {

namespace {

std::unique_ptr<Conv2d> conv(int in, int out, int kernel, int stride, int padding) {
  Conv2dOptions o;
  o.in = in;
  o.out = out;
  o.kernel = kernel;
  o.stride = stride;
  o.padding = padding;
  return std::make_unique<Conv2d>(o);
}

std::unique_ptr<BatchNorm2d> bn(int c, bool relu) {
  return std::make_unique<BatchNorm2d>(c, relu);
}

// ------------------------------------------------------------------------------------------
// ResNet

class BasicBlock : public Module {
 public:
  static constexpr int kExpansion = 1;
  BasicBlock(int in, int planes, int stride) {
    conv1_ = &add("conv1", conv(in, planes, 3, stride, 1));
    bn1_ = &add("bn1", bn(planes, true));
    conv2_ = &add("conv2", conv(planes, planes, 3, 1, 1));
    bn2_ = &add("bn2", bn(planes, false));
    if (stride != 1 || in != planes) {
      auto ds = std::make_unique<Sequential>();
      ds->append(conv(in, planes, 1, stride, 0));
      ds->append(bn(planes, false));
      down_ = &add("downsample", std::move(ds));
    }
  }
  Var forward(const Var& x) override {
    Var h = bn2_->forward(conv2_->forward(bn1_->forward(conv1_->forward(x))));
    return add_relu(h, down_ ? down_->forward(x) : x);
  }

 private:
  Conv2d *conv1_, *conv2_;
  BatchNorm2d *bn1_, *bn2_;
  Sequential* down_ = nullptr;
};

class Bottleneck : public Module {
 public:
  static constexpr int kExpansion = 4;
  Bottleneck(int in, int planes, int stride) {
    const int out = planes * kExpansion;
    conv1_ = &add("conv1", conv(in, planes, 1, 1, 0));
    bn1_ = &add("bn1", bn(planes, true));
    conv2_ = &add("conv2", conv(planes, planes, 3, stride, 1));
    bn2_ = &add("bn2", bn(planes, true));
    conv3_ = &add("conv3", conv(planes, out, 1, 1, 0));
    bn3_ = &add("bn3", bn(out, false));
    if (stride != 1 || in != out) {
      auto ds = std::make_unique<Sequential>();
      ds->append(conv(in, out, 1, stride, 0));
      ds->append(bn(out, false));
      down_ = &add("downsample", std::move(ds));
    }
  }
  Var forward(const Var& x) override {
    Var h = bn1_->forward(conv1_->forward(x));
    h = bn2_->forward(conv2_->forward(h));
    h = bn3_->forward(conv3_->forward(h));
    return add_relu(h, down_ ? down_->forward(x) : x);
  }

 private:
  Conv2d *conv1_, *conv2_, *conv3_;
  BatchNorm2d *bn1_, *bn2_, *bn3_;
  Sequential* down_ = nullptr;
};

template <class Block>
class ResNet : public Module {
 public:
  ResNet(const std::vector<int>& blocks, const ModelOptions& o) {
    conv1_ = &add("conv1", conv(o.in_channels, 64, 7, 2, 3));
    bn1_ = &add("bn1", bn(64, true));
    pool_ = &add("maxpool", std::make_unique<MaxPool2d>(PoolOptions{3, 2, 1}));
    int in = 64;
    const int planes[4] = {64, 128, 256, 512};
    for (int l = 0; l < 4; ++l) {
      auto layer = std::make_unique<Sequential>();
      for (int b = 0; b < blocks[l]; ++b) {
        layer->append(std::make_unique<Block>(in, planes[l], b == 0 && l > 0 ? 2 : 1));
        in = planes[l] * Block::kExpansion;
      }
      layers_[l] = &add("layer" + std::to_string(l + 1), std::move(layer));
    }
    blocks_ = blocks;
    avg_ = &add("avgpool", std::make_unique<AdaptiveAvgPool2d>(1, 1));
    fc_ = &add("fc", std::make_unique<Linear>(512 * Block::kExpansion, o.num_classes));
  }
  Var forward(const Var& x) override {
    Var h = pool_->forward(bn1_->forward(conv1_->forward(x)));
    for (Sequential* l : layers_) h = l->forward(h);
    return fc_->forward(flatten(avg_->forward(h)));
  }
  // The stem, every block, the head: the units.
  std::vector<Piece> chain() override {
    std::vector<Piece> c;
    c.push_back({"stem", {"conv1", "bn1", "maxpool"}, [this](const Var& x) {
                   return pool_->forward(bn1_->forward(conv1_->forward(x)));
                 }});
    for (int l = 0; l < 4; ++l)
      for (int b = 0; b < blocks_[static_cast<size_t>(l)]; ++b) {
        const std::string name = "layer" + std::to_string(l + 1) + "." + std::to_string(b);
        Module* m = &layers_[l]->at(b);
        c.push_back({name, {name}, [m](const Var& x) { return m->forward(x); }});
      }
    c.push_back({"head", {"avgpool", "fc"}, [this](const Var& x) {
                   return fc_->forward(flatten(avg_->forward(x)));
                 }});
    return c;
  }

 private:
  std::vector<int> blocks_;
  Conv2d* conv1_;
  BatchNorm2d* bn1_;
  MaxPool2d* pool_;
  Sequential* layers_[4];
  AdaptiveAvgPool2d* avg_;
  Linear* fc_;
};

// ------------------------------------------------------------------------------------------
// DenseNet (torchvision's memory_efficient = false)

std::unique_ptr<Conv2d> conv_fan_in(int in, int out, int kernel, int stride, int padding) {
  auto c = conv(in, out, kernel, stride, padding);
  c->fan_out = false;
  return c;
}

class DenseLayer : public Module {
 public:
  DenseLayer(int in, int growth, int bn_size) {
    norm1_ = &add("norm1", bn(in, true));
    conv1_ = &add("conv1", conv_fan_in(in, bn_size * growth, 1, 1, 0));
    norm2_ = &add("norm2", bn(bn_size * growth, true));
    conv2_ = &add("conv2", conv_fan_in(bn_size * growth, growth, 3, 1, 1));
  }
  Var forward(const Var& x) override {
    return conv2_->forward(norm2_->forward(conv1_->forward(norm1_->forward(x))));
  }

 private:
  BatchNorm2d *norm1_, *norm2_;
  Conv2d *conv1_, *conv2_;
};

class DenseBlock : public Module {
 public:
  DenseBlock(int layers, int in, int growth, int bn_size) {
    for (int i = 0; i < layers; ++i) {
      layers_.push_back(&add("denselayer" + std::to_string(i + 1),
                             std::make_unique<DenseLayer>(in + i * growth, growth, bn_size)));
    }
  }
  Var forward(const Var& x) override {
    std::vector<Var> features{x};
    for (DenseLayer* l : layers_) {
      features.push_back(l->forward(features.size() == 1 ? x : concat_channels(features)));
    }
    return concat_channels(features);
  }

 private:
  std::vector<DenseLayer*> layers_;
};

class DenseNet : public Module {
 public:
  DenseNet(int growth, const std::vector<int>& blocks, int init_features, const ModelOptions& o) {
    auto f = std::make_unique<Sequential>();
    f->append_named("conv0", conv_fan_in(o.in_channels, init_features, 7, 2, 3));
    names_ = {"conv0", "norm0", "pool0"};
    f->append_named("norm0", bn(init_features, true));  // + relu0
    f->append_named("pool0", std::make_unique<MaxPool2d>(PoolOptions{3, 2, 1}));
    int c = init_features;
    for (size_t i = 0; i < blocks.size(); ++i) {
      f->append_named("denseblock" + std::to_string(i + 1),
                      std::make_unique<DenseBlock>(blocks[i], c, growth, 4));
      names_.push_back("denseblock" + std::to_string(i + 1));
      c += blocks[i] * growth;
      if (i + 1 < blocks.size()) {
        auto t = std::make_unique<Sequential>();
        t->append_named("norm", bn(c, true));  // + relu
        t->append_named("conv", conv_fan_in(c, c / 2, 1, 1, 0));
        t->append_named("pool", std::make_unique<AvgPool2d>(PoolOptions{2, 2, 0}));
        f->append_named("transition" + std::to_string(i + 1), std::move(t));
        names_.push_back("transition" + std::to_string(i + 1));
        c /= 2;
      }
    }
    f->append_named("norm5", bn(c, true));  // + the relu in torchvision's forward
    names_.push_back("norm5");
    features_ = &add("features", std::move(f));
    avg_ = std::make_unique<AdaptiveAvgPool2d>(1, 1);
    auto cls = std::make_unique<Linear>(c, o.num_classes);
    cls->zero_bias = true;
    classifier_ = &add("classifier", std::move(cls));
  }
  Var forward(const Var& x) override {
    return classifier_->forward(flatten(avg_->forward(features_->forward(x))));
  }
  // The stem, each dense block and transition, the head (a dense block's layers share the
  // concatenated features, so the cut is between blocks, not between their layers).
  std::vector<Piece> chain() override {
    std::vector<Piece> c;
    c.push_back(
        {"stem", {"features.conv0", "features.norm0", "features.pool0"}, [this](const Var& x) {
           Var h = x;
           for (int i = 0; i < 3; ++i) h = features_->at(i).forward(h);
           return h;
         }});
    for (int i = 3; i + 1 < features_->size(); ++i) {
      Module* m = &features_->at(i);
      const std::string name = "features." + names_[static_cast<size_t>(i)];
      c.push_back({name, {name}, [m](const Var& x) { return m->forward(x); }});
    }
    Module* norm5 = &features_->at(features_->size() - 1);
    c.push_back({"head", {"features.norm5", "classifier"}, [this, norm5](const Var& x) {
                   return classifier_->forward(flatten(avg_->forward(norm5->forward(x))));
                 }});
    return c;
  }

 private:
  std::vector<std::string> names_;  // features_'s children
  Sequential* features_;
  std::unique_ptr<AdaptiveAvgPool2d> avg_;
  Linear* classifier_;
};

// ------------------------------------------------------------------------------------------
// A small CNN for tests and quick runs on scans.

class SmallCnn : public Module {
 public:
  explicit SmallCnn(const ModelOptions& o) {
    auto f = std::make_unique<Sequential>();
    const int widths[3] = {16, 32, 64};
    int in = o.in_channels;
    for (int i = 0; i < 3; ++i) {
      f->append(conv(in, widths[i], 3, 1, 1));
      f->append(bn(widths[i], true));
      if (i < 2) f->append(std::make_unique<MaxPool2d>(PoolOptions{2, 2, 0}));
      in = widths[i];
    }
    features_ = &add("features", std::move(f));
    avg_ = std::make_unique<AdaptiveAvgPool2d>(1, 1);
    fc_ = &add("fc", std::make_unique<Linear>(in, o.num_classes));
  }
  Var forward(const Var& x) override {
    return fc_->forward(flatten(avg_->forward(features_->forward(x))));
  }
  std::vector<Piece> chain() override {
    std::vector<Piece> c;
    for (int i = 0; i < features_->size(); ++i) {
      Module* m = &features_->at(i);
      const std::string name = "features." + std::to_string(i);
      c.push_back({name, {name}, [m](const Var& x) { return m->forward(x); }});
    }
    c.push_back(
        {"head", {"fc"}, [this](const Var& x) { return fc_->forward(flatten(avg_->forward(x))); }});
    return c;
  }

 private:
  Sequential* features_;
  std::unique_ptr<AdaptiveAvgPool2d> avg_;
  Linear* fc_;
};

using Factory = std::function<std::unique_ptr<Module>(const ModelOptions&)>;

const std::map<std::string, Factory>& factories() {
  static const std::map<std::string, Factory> f{
      {"resnet18",
       [](const ModelOptions& o) {
         return std::make_unique<ResNet<BasicBlock>>(std::vector<int>{2, 2, 2, 2}, o);
       }},
      {"resnet34",
       [](const ModelOptions& o) {
         return std::make_unique<ResNet<BasicBlock>>(std::vector<int>{3, 4, 6, 3}, o);
       }},
      {"resnet50",
       [](const ModelOptions& o) {
         return std::make_unique<ResNet<Bottleneck>>(std::vector<int>{3, 4, 6, 3}, o);
       }},
      {"resnet101",
       [](const ModelOptions& o) {
         return std::make_unique<ResNet<Bottleneck>>(std::vector<int>{3, 4, 23, 3}, o);
       }},
      {"resnet152",
       [](const ModelOptions& o) {
         return std::make_unique<ResNet<Bottleneck>>(std::vector<int>{3, 8, 36, 3}, o);
       }},
      {"densenet121",
       [](const ModelOptions& o) {
         return std::make_unique<DenseNet>(32, std::vector<int>{6, 12, 24, 16}, 64, o);
       }},
      {"smallcnn", [](const ModelOptions& o) { return std::make_unique<SmallCnn>(o); }},
  };
  return f;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (auto& [n, f] : factories()) names.push_back(n);
  return names;
}

std::unique_ptr<Model> make_model(const std::string& name, const ModelOptions& o) {
  auto it = factories().find(name);
  if (it == factories().end()) {
    std::string known;
    for (auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
    COHORT_THROW("unknown model '" << name << "' (known: " << known << ")");
  }
  COHORT_CHECK(o.in_channels > 0 && o.num_classes > 0, "model " << name << ": in_channels "
                                                                << o.in_channels << ", num_classes "
                                                                << o.num_classes);
  // The units: ResNet's blocks, DenseNet's dense layers and transitions, the small CNN's layers;
  // the stem and the head are the runs of parameters around them.
  std::function<bool(const std::string&)> is_unit;
  auto depth = [](const std::string& s) { return std::count(s.begin(), s.end(), '.'); };
  if (name.rfind("resnet", 0) == 0) {
    is_unit = [depth](const std::string& m) { return m.rfind("layer", 0) == 0 && depth(m) == 1; };
  } else if (name.rfind("densenet", 0) == 0) {
    is_unit = [depth](const std::string& m) {
      return (m.rfind("features.denseblock", 0) == 0 && depth(m) == 2) ||
             (m.rfind("features.transition", 0) == 0 && depth(m) == 1);
    };
  } else if (name == "smallcnn") {
    is_unit = [depth](const std::string& m) {
      return m.rfind("features.", 0) == 0 && depth(m) == 1;
    };
  }
  return std::make_unique<Model>(name, it->second(o), o, is_unit);
}

// ------------------------------------------------------------------------------------------

namespace {

// The units of a module tree: each module that is_unit names, and each run of parameters between
// them (named "stem" before the first, "head" after the last).
std::vector<Unit> find_units(Module& root, const std::vector<Param*>& params,
                             const std::function<bool(const std::string&)>& is_unit) {
  std::vector<std::string> prefixes;  // the unit modules, "name."
  if (is_unit) {
    std::vector<std::pair<std::string, Module*>> mods;
    root.modules("", &mods);
    for (auto& [name, m] : mods)
      if (!name.empty() && is_unit(name)) prefixes.push_back(name + ".");
  }
  auto unit_of = [&](const std::string& param) -> std::string {
    for (const std::string& p : prefixes)
      if (param.compare(0, p.size(), p) == 0) return p.substr(0, p.size() - 1);
    return "";
  };
  std::vector<Unit> units;
  bool seen_unit = false;
  for (size_t i = 0; i < params.size(); ++i) {
    std::string name = unit_of(params[i]->name);
    const bool outside = name.empty();
    if (outside) name = seen_unit ? "head" : "stem";
    seen_unit = seen_unit || !outside;
    if (units.empty() || units.back().name != name) {
      Unit u;
      u.name = name;
      u.first = static_cast<int>(i);
      units.push_back(u);
    }
    units.back().last = static_cast<int>(i) + 1;
  }
  // A run outside units between two units: named by its position.
  for (size_t i = 1; i + 1 < units.size(); ++i)
    if (units[i].name == "head") units[i].name = "between." + std::to_string(i);
  return units;
}

}  // namespace

Model::Model(std::string name, std::unique_ptr<Module> root, const ModelOptions& o,
             const std::function<bool(const std::string&)>& is_unit)
    : name_(std::move(name)), root_(std::move(root)), opt_(o) {
  root_->collect("", &params_, &buffers_);
  for (size_t i = 0; i < params_.size(); ++i) params_[i]->index = static_cast<int>(i);
  units_ = find_units(*root_, params_, is_unit);
  pieces_ = root_->chain();
  // Each piece's parameters: those under its modules, which must be the next ones in order.
  int next = 0;
  for (Piece& pc : pieces_) {
    pc.first = next;
    auto under = [&pc](const std::string& param) {
      for (const std::string& m : pc.modules)
        if (param.compare(0, m.size() + 1, m + ".") == 0) return true;
      return false;
    };
    while (next < static_cast<int>(params_.size()) &&
           under(params_[static_cast<size_t>(next)]->name))
      ++next;
    pc.last = next;
  }
  COHORT_CHECK(pieces_.empty() || next == static_cast<int>(params_.size()),
               "model " << name_ << ": its chain of pieces does not cover parameter "
                        << params_[static_cast<size_t>(next)]->name << " in order");
  align_units(1);
  reset_parameters(o.seed);
}

void Model::align_units(size_t align) {
  COHORT_CHECK(align > 0, "unit alignment " << align);
  auto up = [align](size_t n) { return (n + align - 1) / align * align; };
  size_t total = 0;
  for (Unit& u : units_) {
    total = up(total);
    u.begin = total;
    for (int i = u.first; i < u.last; ++i) {
      params_[static_cast<size_t>(i)]->offset = total;
      total += flat_slot(
          static_cast<size_t>(tensor::shape_numel(params_[static_cast<size_t>(i)]->shape)));
    }
    total = up(total);
    u.end = total;
  }
  // Gradients start again from zero; values move parameter by parameter, each one's old pages
  // returned once copied, so that the new layout never holds a second copy of the model.
  for (Param* p : params_) p->grad = Tensor();
  grads_ = Tensor::empty({static_cast<int64_t>(total)});
  tensor::drop_pages(grads_.raw(), grads_.bytes());
  values_ = Tensor::empty({static_cast<int64_t>(total)});
  tensor::drop_pages(values_.raw(), values_.bytes());
  for (Param* p : params_) {
    Tensor before = p->value;
    p->value = Tensor::view_of(values_, p->offset * sizeof(float), p->shape);
    p->grad = Tensor::view_of(grads_, p->offset * sizeof(float), p->shape);
    if (before.defined()) {
      p->value.copy_(before);
      tensor::drop_pages(before.raw(), before.bytes());
    }
  }
}

namespace {

// One flat buffer moved into `storage`, and every Param's view of it (`view`) following.
void place_flat(Tensor& flat, void* storage, const std::vector<Param*>& params,
                Tensor Param::*view) {
  Tensor placed = Tensor::wrap(storage, flat.shape(), flat.dtype());
  placed.copy_(flat);
  flat = placed;
  for (Param* p : params) p->*view = Tensor::view_of(flat, p->offset * sizeof(float), p->shape);
}

}  // namespace

void Model::place_grads(void* storage) {
  place_flat(grads_, storage, params_, &Param::grad);
}

void Model::place_values(void* storage) {
  place_flat(values_, storage, params_, &Param::value);
}

void Model::reset_parameters(uint64_t seed) {
  std::vector<std::pair<std::string, Module*>> mods;
  root_->modules("", &mods);
  for (auto& [name, m] : mods) {
    m->reset_parameters(key3(seed, fnv1a64(name), 0x1417));
  }
}

Param* Model::find_param(const std::string& name) const {
  for (Param* p : params_)
    if (p->name == name) return p;
  return nullptr;
}

Buffer* Model::find_buffer(const std::string& name) const {
  for (Buffer* b : buffers_)
    if (b->name == name) return b;
  return nullptr;
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (Param* p : params_) n += tensor::shape_numel(p->shape);
  return n;
}

}  // namespace cohort::nn
