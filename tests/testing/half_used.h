// A model with a layer its forward never uses: the parameters that get no gradient, for the
// data-parallel tests (their gradients must still go out, and nobody may hang).
#pragma once

#include <memory>

#include "cohort/nn/layers.h"
#include "cohort/nn/module.h"

namespace cohort::testing {

class HalfUsed : public nn::Module {
 public:
  HalfUsed() {
    used_ = &add("used", std::make_unique<nn::Linear>(4, 3));
    add("unused", std::make_unique<nn::Linear>(4, 3));
  }
  nn::Var forward(const nn::Var& x) override { return used_->forward(x); }

 private:
  nn::Linear* used_;
};

}  // namespace cohort::testing
