// The files Cohort reads from disk, other than images, fed from one fuzz input: safetensors,
// record shards, checkpoints (index and piece), training configs (TOML and JSON), CSV lists,
// cluster files (TOML and JSON), model profiles and training logs (read and drawn by cohort
// report). Shared by fuzz_files and the test that
// replays the committed corpus in the ordinary build.
//
// An input is one byte choosing the reader, then the file's bytes. For a checkpoint the bytes
// are the index (checkpoint.json), kCheckpointSeparator, then the piece file it may name,
// "piece.safetensors".
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace cohort::fuzz {

inline constexpr char kCheckpointSeparator[] = "\n--piece--\n";

enum class FileKind : uint8_t {
  safetensors,
  shard,
  checkpoint,
  config_toml,
  config_json,
  csv_list,
  cluster_toml,
  cluster_json,
  profile,
  run_log,
  count
};
const char* file_kind_name(FileKind k);

// A refusal whose message does not name the file it refused: the reader's own defect, which
// the fuzzer and the test report like a crash.
class UnnamedRefusal : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Writes the input under `scratch` (an empty folder it may use) and runs the reader on it.
// Returns normally when the file was read, throws cohort::Error when it was refused naming the
// file, and UnnamedRefusal when a refusal does not name it. Anything else escaping is a defect.
FileKind read_fuzzed_file(const uint8_t* data, size_t size, const std::string& scratch);

}  // namespace cohort::fuzz
