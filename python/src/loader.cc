// PipelineLoader: data::Pipeline's acquire/release behind torch tensors that own their batch.
#include "loader.h"

#include <pybind11/pybind11.h>

#include "cohort/core/log.h"

namespace cohort::python {

PipelineLoader::PipelineLoader(const std::string& path, data::PipelineOptions opt)
    : source_(data::open_source(path)), opt_(std::move(opt)) {
  pipeline_ = std::make_shared<data::Pipeline>(source_, opt_);
  for (size_t i = 0; i < source_->size(); ++i) {
    for (int l : source_->labels(i)) classes_ = std::max(classes_, l + 1);
  }
  classes_ = std::max(classes_, static_cast<int>(source_->class_names().size()));
}

std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> PipelineLoader::next(
    bool multilabel) {
  data::Batch b;
  std::optional<size_t> ticket;
  {
    pybind11::gil_scoped_release nogil;
    ticket = pipeline_->acquire(&b);
  }
  if (!ticket) return std::nullopt;
  const int64_t n = b.size, c = b.channels, h = b.height, w = b.width;
  const at::ScalarType type = opt_.out == data::OutType::f32    ? at::kFloat
                              : opt_.out == data::OutType::bf16 ? at::kBFloat16
                                                                : at::kByte;
  // NCHW, or the same logical shape with channels-last strides over an NHWC buffer.
  std::vector<int64_t> strides = opt_.layout == data::Layout::nchw
                                     ? std::vector<int64_t>{c * h * w, h * w, w, 1}
                                     : std::vector<int64_t>{h * w * c, 1, w * c, c};
  auto owner = pipeline_;
  const size_t t = *ticket;
  at::Tensor images = at::from_blob(
      const_cast<uint8_t*>(b.data), {n, c, h, w}, strides,
      [owner, t](void*) {
        try {
          owner->release(t);
        } catch (const std::exception& e) {
          COHORT_LOG(warn, "cohort.data: " << e.what());
        }
      },
      at::TensorOptions().dtype(type));
  at::Tensor labels;
  if (multilabel) {
    labels = at::zeros({n, classes_}, at::kFloat);
    auto acc = labels.accessor<float, 2>();
    for (int64_t i = 0; i < n; ++i) {
      for (int l : b.label_sets[static_cast<size_t>(i)]) acc[i][l] = 1.f;
    }
  } else {
    labels = at::empty({n}, at::kLong);
    for (int64_t i = 0; i < n; ++i) labels[i] = b.labels[static_cast<size_t>(i)];
  }
  at::Tensor indices = at::empty({n}, at::kLong);
  auto* ip = indices.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) ip[i] = static_cast<int64_t>(b.indices[static_cast<size_t>(i)]);
  return std::make_tuple(images, labels, indices);
}

}  // namespace cohort::python
