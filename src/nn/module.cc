#include "cohort/nn/module.h"

namespace cohort::nn {

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, c] : children_) c->train(on);
}

void Module::collect(const std::string& prefix, std::vector<Param*>* params,
                     std::vector<Buffer*>* buffers) {
  for (auto& p : params_) {
    p->name = prefix + p->name.substr(p->name.rfind('.') + 1);
    if (params) params->push_back(p.get());
  }
  for (auto& b : buffers_) {
    b->name = prefix + b->name.substr(b->name.rfind('.') + 1);
    if (buffers) buffers->push_back(b.get());
  }
  for (auto& [name, c] : children_) c->collect(prefix + name + ".", params, buffers);
}

void Module::modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>* out) {
  out->emplace_back(prefix, this);
  for (auto& [name, c] : children_) c->modules(prefix.empty() ? name : prefix + "." + name, out);
}

Param& Module::add_param(const std::string& name, Shape shape, bool decay) {
  auto p = std::make_unique<Param>();
  p->name = name;
  p->shape = std::move(shape);
  p->decay = decay;
  params_.push_back(std::move(p));
  return *params_.back();
}

Buffer& Module::add_buffer(const std::string& name, Tensor value) {
  auto b = std::make_unique<Buffer>();
  b->name = name;
  b->value = std::move(value);
  buffers_.push_back(std::move(b));
  return *buffers_.back();
}

Var Sequential::forward(const Var& x) {
  Var h = x;
  for (Module* m : order_) h = m->forward(h);
  return h;
}

}  // namespace cohort::nn
