// Model profiles: the built-in ones, computed layer by layer from the architectures that
// cohort::nn builds (torchvision's layouts and module names), and profiles as JSON files.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <type_traits>

#include "cohort/core/error.h"
#include "cohort/core/json_number.h"
#include "cohort/plan/plan.h"

namespace cohort::plan {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::conv:
      return "conv";
    case LayerKind::linear:
      return "linear";
    case LayerKind::norm:
      return "norm";
    case LayerKind::pool:
      return "pool";
    case LayerKind::add:
      return "add";
    case LayerKind::other:
      return "other";
  }
  return "other";
}

int64_t ModelProfile::parameters() const {
  int64_t n = 0;
  for (const Layer& l : layers) n += l.parameters;
  return n;
}

double ModelProfile::forward_flops() const {
  double f = 0;
  for (const Layer& l : layers) f += l.forward_flops;
  return f;
}

std::vector<std::string> ModelProfile::units() const {
  std::vector<std::string> u;
  for (const Layer& l : layers)
    if (u.empty() || u.back() != l.unit) u.push_back(l.unit);
  return u;
}

namespace {

// Walks an architecture, tracking the activation's shape, and records one Layer per module.
struct Builder {
  ModelProfile p;
  int c, h, w;
  std::string unit = "stem";

  double elements() const { return static_cast<double>(c) * h * w; }

  Layer& push(const std::string& name, LayerKind kind) {
    Layer l;
    l.name = name;
    l.unit = unit;
    l.kind = kind;
    p.layers.push_back(l);
    return p.layers.back();
  }
  void conv(const std::string& name, int out, int k, int stride, int pad) {
    const int ho = (h + 2 * pad - k) / stride + 1, wo = (w + 2 * pad - k) / stride + 1;
    Layer& l = push(name, LayerKind::conv);
    l.parameters = static_cast<int64_t>(c) * out * k * k;
    l.forward_flops = 2.0 * c * k * k * out * ho * wo;
    l.saved_elements = elements();  // the input, for the weight gradient
    l.moved_elements = elements() + static_cast<double>(out) * ho * wo;
    c = out;
    h = ho;
    w = wo;
  }
  // BatchNorm (with the ReLU fused where the model has one): statistics, then normalise.
  void norm(const std::string& name, bool relu) {
    Layer& l = push(name, LayerKind::norm);
    l.parameters = 2 * static_cast<int64_t>(c);
    l.forward_flops = 8 * elements();
    l.saved_elements = elements() * (relu ? 2 : 1);
    l.moved_elements = 3 * elements();
  }
  void pool(const std::string& name, int k, int stride, int pad, bool max) {
    const int ho = (h + 2 * pad - k) / stride + 1, wo = (w + 2 * pad - k) / stride + 1;
    Layer& l = push(name, LayerKind::pool);
    l.forward_flops = static_cast<double>(k) * k * c * ho * wo;
    l.saved_elements = max ? elements() : 0;
    l.moved_elements = elements() + static_cast<double>(c) * ho * wo;
    h = ho;
    w = wo;
  }
  void global_pool(const std::string& name) {
    Layer& l = push(name, LayerKind::pool);
    l.forward_flops = elements();
    l.moved_elements = elements() + c;
    h = w = 1;
  }
  void add_relu(const std::string& name) {
    Layer& l = push(name, LayerKind::add);
    l.forward_flops = 2 * elements();
    l.saved_elements = elements();
    l.moved_elements = 3 * elements();
  }
  void concat(const std::string& name, int added) {
    Layer& l = push(name, LayerKind::other);
    l.moved_elements = 2 * elements();  // the concatenation is materialised
    c += added;
    l.saved_elements = elements();
  }
  void linear(const std::string& name, int out) {
    Layer& l = push(name, LayerKind::linear);
    l.parameters = static_cast<int64_t>(c) * out + out;
    l.forward_flops = 2.0 * c * out;
    l.saved_elements = c;
    l.moved_elements = c + out;
    c = out;
  }
};

void resnet(Builder& b, const std::vector<int>& blocks, bool bottleneck) {
  b.conv("conv1", 64, 7, 2, 3);
  b.norm("bn1", true);
  b.pool("maxpool", 3, 2, 1, true);
  const int expansion = bottleneck ? 4 : 1;
  int in = 64;
  const int planes[4] = {64, 128, 256, 512};
  for (int l = 0; l < 4; ++l) {
    for (int k = 0; k < blocks[static_cast<size_t>(l)]; ++k) {
      const std::string u = "layer" + std::to_string(l + 1) + "." + std::to_string(k);
      b.unit = u;
      const int stride = k == 0 && l > 0 ? 2 : 1;
      const int out = planes[l] * expansion;
      const int c0 = b.c, h0 = b.h, w0 = b.w;
      if (bottleneck) {
        b.conv(u + ".conv1", planes[l], 1, 1, 0);
        b.norm(u + ".bn1", true);
        b.conv(u + ".conv2", planes[l], 3, stride, 1);
        b.norm(u + ".bn2", true);
        b.conv(u + ".conv3", out, 1, 1, 0);
        b.norm(u + ".bn3", false);
      } else {
        b.conv(u + ".conv1", planes[l], 3, stride, 1);
        b.norm(u + ".bn1", true);
        b.conv(u + ".conv2", planes[l], 3, 1, 1);
        b.norm(u + ".bn2", false);
      }
      if (stride != 1 || in != out) {  // the shortcut reads the block's input
        const int c1 = b.c, h1 = b.h, w1 = b.w;
        b.c = c0;
        b.h = h0;
        b.w = w0;
        b.conv(u + ".downsample.0", out, 1, stride, 0);
        b.norm(u + ".downsample.1", false);
        b.c = c1;
        b.h = h1;
        b.w = w1;
      }
      b.add_relu(u + ".add");
      in = out;
    }
  }
  b.unit = "head";
  b.global_pool("avgpool");
  b.linear("fc", b.p.classes);
}

void densenet(Builder& b, int growth, const std::vector<int>& blocks, int init) {
  b.conv("features.conv0", init, 7, 2, 3);
  b.norm("features.norm0", true);
  b.pool("features.pool0", 3, 2, 1, true);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string block = "features.denseblock" + std::to_string(i + 1);
    for (int k = 0; k < blocks[i]; ++k) {
      const std::string u = block + ".denselayer" + std::to_string(k + 1);
      b.unit = u;
      const int c0 = b.c;
      b.norm(u + ".norm1", true);
      b.conv(u + ".conv1", 4 * growth, 1, 1, 0);
      b.norm(u + ".norm2", true);
      b.conv(u + ".conv2", growth, 3, 1, 1);
      b.c = c0;
      b.concat(u + ".concat", growth);
    }
    if (i + 1 < blocks.size()) {
      const std::string u = "features.transition" + std::to_string(i + 1);
      b.unit = u;
      b.norm(u + ".norm", true);
      b.conv(u + ".conv", b.c / 2, 1, 1, 0);
      b.pool(u + ".pool", 2, 2, 0, false);
    }
  }
  b.unit = "head";
  b.norm("features.norm5", true);
  b.global_pool("avgpool");
  b.linear("classifier", b.p.classes);
}

struct Arch {
  std::vector<int> blocks;
  bool bottleneck = false;
  bool dense = false;
};

const std::map<std::string, Arch>& archs() {
  static const std::map<std::string, Arch> a{
      {"resnet18", {{2, 2, 2, 2}, false, false}},  {"resnet34", {{3, 4, 6, 3}, false, false}},
      {"resnet50", {{3, 4, 6, 3}, true, false}},   {"resnet101", {{3, 4, 23, 3}, true, false}},
      {"resnet152", {{3, 8, 36, 3}, true, false}}, {"densenet121", {{6, 12, 24, 16}, false, true}},
  };
  return a;
}

std::string known_models() {
  std::string s;
  for (const auto& m : builtin_models()) s += (s.empty() ? "" : ", ") + m;
  return s;
}

}  // namespace

std::vector<std::string> builtin_models() {
  std::vector<std::string> n;
  for (const auto& [name, a] : archs()) n.push_back(name);
  return n;
}

ModelProfile builtin_profile(const std::string& model, int image, int in_channels, int classes) {
  auto it = archs().find(model);
  COHORT_CHECK(it != archs().end(), "no built-in profile for model '"
                                        << model << "' (built in: " << known_models()
                                        << "; or pass a profile file)");
  COHORT_CHECK(image >= 32 && image <= 16384,
               "image size " << image << " px: expected 32 to 16384");
  COHORT_CHECK(in_channels > 0 && classes > 0,
               "in_channels " << in_channels << ", classes " << classes << ": expected > 0");
  Builder b;
  b.p.model = model;
  b.p.image = image;
  b.p.in_channels = in_channels;
  b.p.classes = classes;
  b.c = in_channels;
  b.h = b.w = image;
  if (it->second.dense) {
    densenet(b, 32, it->second.blocks, 64);
  } else {
    resnet(b, it->second.blocks, it->second.bottleneck);
  }
  return b.p;
}

// ---------------------------------------------------------------------------------------------
// Measured times

namespace {

// The layer kind an op of this profile scope times; `other` for ops of no layer.
LayerKind kind_of_op(const std::string& op, bool* layer) {
  *layer = true;
  auto starts = [&](const char* p) { return op.rfind(p, 0) == 0; };
  if (starts("conv.")) return LayerKind::conv;
  if (starts("bn.") || starts("syncbn.")) return LayerKind::norm;
  if (starts("pool.") || starts("avgpool.")) return LayerKind::pool;
  if (starts("add.")) return LayerKind::add;
  if (starts("linear.")) return LayerKind::linear;
  if (starts("concat.")) return LayerKind::other;
  *layer = false;
  return LayerKind::other;
}

}  // namespace

void attach_measurements(ModelProfile& p, const std::vector<MeasuredOp>& ops, int steps,
                         int batch) {
  COHORT_CHECK(steps > 0 && batch > 0,
               "measured over " << steps << " steps of " << batch << " images: expected both > 0");
  size_t j = 0;
  for (Layer& l : p.layers) {
    bool found = false;
    while (j < ops.size() && !found) {
      bool layer = false;
      const LayerKind k = kind_of_op(ops[j].kind, &layer);
      if (layer && k == l.kind) {
        l.measured_ms = (ops[j].forward_s + ops[j].backward_s) / steps / batch * 1e3;
        found = true;
      }
      ++j;
    }
    COHORT_CHECK(found, "the measured ops of " << p.model << " do not follow its layers: none "
                                               << "left for layer " << l.name << " ("
                                               << layer_kind_name(l.kind) << ") after "
                                               << ops.size() << " ops");
  }
  p.source = "computed from the model definition; times measured by cohort bench train";
}

// ---------------------------------------------------------------------------------------------
// JSON

namespace {

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  COHORT_CHECK(j.contains(key), where << ": missing field '" << key << "'");
  const nlohmann::json& v = j.at(key);
  if constexpr (std::is_integral_v<T>) {
    COHORT_CHECK(holds_whole_number<T>(v),
                 where << ": field '" << key << "': expected a whole number from "
                       << std::numeric_limits<T>::min() << " to " << std::numeric_limits<T>::max()
                       << ", got " << v.dump());
  }
  try {
    return v.get<T>();
  } catch (const nlohmann::json::exception& e) {
    COHORT_THROW(where << ": field '" << key << "': " << e.what());
  }
}

// An optional field: `fallback` when absent, else of type T.
template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& where, T fallback) {
  return j.contains(key) ? field<T>(j, key, where) : fallback;
}

LayerKind parse_kind(const std::string& s, const std::string& where) {
  for (LayerKind k : {LayerKind::conv, LayerKind::linear, LayerKind::norm, LayerKind::pool,
                      LayerKind::add, LayerKind::other}) {
    if (s == layer_kind_name(k)) return k;
  }
  COHORT_THROW(where << ": field 'kind': '" << s
                     << "' is not one of conv, linear, norm, pool, add, other");
}

}  // namespace

ModelProfile read_profile(const std::string& path) {
  std::ifstream f(path);
  COHORT_CHECK(f, "profile " << path << ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    COHORT_THROW("profile " << path << ": not JSON: " << e.what());
  }
  COHORT_CHECK(j.is_object(), "profile " << path << ": expected a JSON object");
  ModelProfile p;
  p.model = field<std::string>(j, "model", path);
  p.image = field<int>(j, "image", path);
  p.in_channels = field<int>(j, "in_channels", path, 3);
  p.classes = field<int>(j, "classes", path, 1000);
  p.source = field<std::string>(j, "source", path, path);
  COHORT_CHECK(p.image > 0 && p.in_channels > 0 && p.classes > 0,
               path << ": image " << p.image << ", in_channels " << p.in_channels << " and classes "
                    << p.classes << " must be positive");
  COHORT_CHECK(j.contains("layers") && j["layers"].is_array() && !j["layers"].empty(),
               path << ": field 'layers': expected a non-empty list");
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    const nlohmann::json& e = j["layers"][i];
    const std::string where = path + ": layers[" + std::to_string(i) + "]";
    Layer l;
    l.name = field<std::string>(e, "name", where);
    l.unit = field<std::string>(e, "unit", where, l.name);
    l.kind = parse_kind(field<std::string>(e, "kind", where, "other"), where);
    l.forward_flops = field<double>(e, "forward_flops", where);
    l.parameters = field<int64_t>(e, "parameters", where);
    l.saved_elements = field<double>(e, "saved_elements", where);
    l.moved_elements = field<double>(e, "moved_elements", where, l.saved_elements);
    l.measured_ms = field<double>(e, "measured_ms", where, -1.0);
    COHORT_CHECK(l.forward_flops >= 0 && l.parameters >= 0 && l.saved_elements >= 0,
                 where << ": negative forward_flops, parameters or saved_elements");
    p.layers.push_back(l);
  }
  return p;
}

void write_profile(const ModelProfile& p, const std::string& path) {
  nlohmann::json layers = nlohmann::json::array();
  for (const Layer& l : p.layers) {
    nlohmann::json e = {{"name", l.name},
                        {"unit", l.unit},
                        {"kind", layer_kind_name(l.kind)},
                        {"forward_flops", l.forward_flops},
                        {"parameters", l.parameters},
                        {"saved_elements", l.saved_elements},
                        {"moved_elements", l.moved_elements}};
    if (l.measured_ms >= 0) e["measured_ms"] = l.measured_ms;
    layers.push_back(e);
  }
  nlohmann::json j = {{"model", p.model},     {"image", p.image},   {"in_channels", p.in_channels},
                      {"classes", p.classes}, {"source", p.source}, {"layers", layers}};
  std::ofstream f(path);
  COHORT_CHECK(f, "profile " << path << ": cannot write");
  f << j.dump(1) << "\n";
  COHORT_CHECK(f.good(), "profile " << path << ": write failed (disk full?)");
}

}  // namespace cohort::plan
