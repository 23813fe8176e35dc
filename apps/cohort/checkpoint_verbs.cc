// `cohort checkpoint inspect DIR` and `cohort checkpoint consolidate DIR --out FILE`: what a
// (sharded) checkpoint holds, and its whole model as one safetensors file torchvision loads.
#include <cstdio>
#include <memory>
#include <string>

#include "cohort/dist/checkpoint.h"
#include "verbs.h"

namespace cohort::cli {

Run add_checkpoint_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  app.add_option("dir", *dir, "Checkpoint directory (--checkpoint-dir of cohort train)")
      ->required();
  return [dir]() -> int {
    std::printf("%s", dist::describe_checkpoint(*dir).c_str());
    return 0;
  };
}

Run add_checkpoint_consolidate(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  app.add_option("dir", *dir, "Checkpoint directory")->required();
  app.add_option("--out", *out, "The safetensors file to write (torchvision's names)")->required();
  return [dir, out]() -> int {
    dist::consolidate_checkpoint(*dir, *out);
    std::printf("%s: the whole model from %s\n", out->c_str(), dir->c_str());
    return 0;
  };
}

}  // namespace cohort::cli
