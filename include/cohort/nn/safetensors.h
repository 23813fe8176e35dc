// safetensors, the weight format PyTorch users exchange: an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then raw bytes.
// Writes go to a temporary name, are flushed and fsynced, then renamed over the target, so a
// crash mid-write leaves the previous file intact.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cohort/nn/model.h"

namespace cohort::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// verify, when given, reads the complete temporary file before it replaces `path` and throws
// if it is wrong; the previous file then stays.
using VerifyFile = std::function<void(const std::string& tmp_path)>;
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const VerifyFile& verify = nullptr);

struct SafeTensors {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};
// Every malformed, truncated or inconsistent file is an error naming the file and the entry.
SafeTensors load_safetensors(const std::string& path);

// The model's parameters and buffers under torchvision's names (torch's state_dict).
void save_weights(const Model& m, const std::string& path,
                  const std::map<std::string, std::string>& metadata = {});
// Strict, as torch's load_state_dict: every name present with the same shape, nothing extra.
// bf16/f16 values are widened to f32.
void load_weights(Model& m, const std::string& path);

// Takes the next bytes of a file being written; throws, naming the file, when the write fails.
using ByteSink = std::function<void(const void* data, size_t len)>;

// Writes a file through a temporary file, fsync and rename (also used by checkpoints): `produce`
// hands its bytes, in order, to the sink it is given, so that a file passed in pieces is never
// whole in memory. On any failure, `produce`'s or `verify`'s included, the temporary file is
// removed and the file at `path` stays as it was.
void write_stream_atomically(const std::string& path,
                             const std::function<void(const ByteSink&)>& produce,
                             const VerifyFile& verify = nullptr);
// The same for bytes already in memory, `parts` one after another.
void write_file_atomically(const std::string& path,
                           const std::vector<std::pair<const void*, size_t>>& parts,
                           const VerifyFile& verify = nullptr);

}  // namespace cohort::nn
