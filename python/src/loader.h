// The input pipeline as torch tensors: each batch's images are a tensor over the pipeline's own
// batch buffer (no copy); the buffer goes back to the pipeline when the tensor is freed.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "cohort/data/pipeline.h"

namespace cohort::python {

class PipelineLoader {
 public:
  PipelineLoader(const std::string& path, data::PipelineOptions opt);

  void start_epoch(uint64_t epoch, size_t from) { pipeline_->start_epoch(epoch, from); }
  // (images, labels, indices) or nullopt at the end of the epoch. Labels: int64 (first label)
  // or, with `multilabel`, a float multi-hot [n, classes]. Waits without the GIL.
  std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> next(bool multilabel);
  size_t batches_per_epoch() const { return pipeline_->batches_per_epoch(); }
  size_t dataset_size() const { return source_->size(); }
  int num_classes() const { return classes_; }
  std::vector<std::string> class_names() const { return source_->class_names(); }
  int channels() const { return pipeline_->channels(); }
  data::PipelineStats stats() const { return pipeline_->stats(); }

 private:
  std::shared_ptr<data::Source> source_;
  data::PipelineOptions opt_;
  std::shared_ptr<data::Pipeline> pipeline_;
  int classes_ = 0;
};

}  // namespace cohort::python
