// What the files of src/dist/checkpoint/ share: the format's name, the pieces' names and CRCs,
// the index, and moving files between ranks. The jobs, a file each:
//   format.cc    names, CRCs, the index (parsed field by field) and the files it lists
//   transfer.cc  a file carried between ranks and hosts, in pieces, with its CRC checked
//   save.cc      writing a checkpoint: each rank's pieces, the index last, the old one replaced
//                only once the new one is complete and verified
//   load.cc      reading one into any layout (resharding), and sharing it across hosts
//   inspect.cc   describing and consolidating a checkpoint (cohort checkpoint ...)
#pragma once

#include "cohort/dist/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/json_number.h"
#include "cohort/data/shards.h"
#include "cohort/nn/safetensors.h"

namespace cohort::dist {

namespace fs = std::filesystem;

namespace checkpoint_impl {

inline constexpr const char* kFormat = "cohort-checkpoint-2";

// format.cc
uint32_t crc_of(const nn::NamedTensors& ts);
// The data section's CRC, straight from the file's bytes.
uint32_t file_data_crc(const std::string& path);
std::string piece_name(const std::string& prefix, const std::string& param, size_t lo, size_t hi);
bool parse_piece(const std::string& name, const std::string& prefix, std::string* param, size_t* lo,
                 size_t* hi);
std::string slurp(const std::string& path);
// What a failed checkpoint leaves, for its error.
std::string what_is_kept(const std::string& dir, bool had_one);
// The index's text, checked field by field; `path` is what errors call it.
nlohmann::json parse_index(const std::string& text, const std::string& path);
nlohmann::json read_index(const std::string& dir);
RunPosition position_of(const nlohmann::json& index);
// Each file of the index, read and checked against its own CRC and the index's.
nn::SafeTensors read_file(const std::string& dir, const nlohmann::json& f);

// transfer.cc
// Each rank's host, named by the lowest rank on it.
std::vector<int> hosts_of_ranks(comm::Communicator& w);
int keeper_of(int r, const std::vector<int>& host);
int64_t pass_file(const std::function<void(void*, size_t)>& move, int holder, bool holds,
                  const std::string& src, bool writes, const std::string& dst, uint32_t crc,
                  std::string* error);
// pass_file from rank `from` to rank `to` (a send and a receive); other ranks do nothing.
int64_t pass_file_to(comm::Communicator& w, int from, int to, const std::string& src,
                     const std::string& dst, uint32_t crc, std::string* error);
// Rank `root`'s bytes on every rank.
std::string broadcast_bytes(comm::Communicator& w, int root, std::string bytes);

}  // namespace checkpoint_impl
}  // namespace cohort::dist
