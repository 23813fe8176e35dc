// A checkpoint's format (see internal.h): piece names, CRCs, the index and the files it lists.
#include "internal.h"

namespace cohort::dist {
namespace checkpoint_impl {

uint32_t crc_of(const nn::NamedTensors& ts) {
  uint32_t crc = 0;
  for (auto& [name, t] : ts) {
    nn::Tensor c = t.contiguous();
    crc = data::crc32c(static_cast<const uint8_t*>(c.raw()), c.bytes(), crc);
  }
  return crc;
}

// The data section's CRC, straight from the file's bytes.
uint32_t file_data_crc(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint8_t len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  in.seekg(static_cast<std::streamoff>(8 + n));
  std::vector<uint8_t> buf(1 << 20);
  uint32_t crc = 0;
  while (in) {
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    crc = data::crc32c(buf.data(), static_cast<size_t>(in.gcount()), crc);
  }
  return crc;
}

std::string piece_name(const std::string& prefix, const std::string& param, size_t lo, size_t hi) {
  return prefix + param + "[" + std::to_string(lo) + ":" + std::to_string(hi) + "]";
}

// "prefix<param>[lo:hi]" -> param, lo, hi; false when the name is not such a piece.
bool parse_piece(const std::string& name, const std::string& prefix, std::string* param, size_t* lo,
                 size_t* hi) {
  if (name.compare(0, prefix.size(), prefix) != 0 || name.back() != ']') return false;
  const size_t open = name.rfind('['), colon = name.rfind(':');
  if (open == std::string::npos || colon == std::string::npos || colon < open) return false;
  *param = name.substr(prefix.size(), open - prefix.size());
  *lo = std::stoull(name.substr(open + 1, colon - open - 1));
  *hi = std::stoull(name.substr(colon + 1, name.size() - colon - 2));
  return true;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  COHORT_CHECK(in, "cannot read " << path << ": " << errno_string(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// What a failed checkpoint leaves, for its error: the previous one, where the folder still has
// an index (a folder that vanished, or was emptied, keeps nothing); `had_one`: the folder had an
// index when this checkpoint began.
std::string what_is_kept(const std::string& dir, bool had_one) {
  std::error_code ec;
  if (fs::exists(checkpoint_index(dir), ec)) return dir + " keeps the previous checkpoint";
  if (!had_one) return dir + " holds no checkpoint yet (this was its first)";
  return dir + " holds no checkpoint any more (the folder or its index is gone)";
}

// The index's text, checked field by field; `path` is what errors call it.
nlohmann::json parse_index(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    COHORT_THROW(path << " is not JSON: " << e.what());
  }
  COHORT_CHECK(j.is_object(), path << ": expected a JSON object, found " << j.type_name());
  COHORT_CHECK(j.contains("format") && j["format"] == kFormat,
               path << ": format " << (j.contains("format") ? j["format"].dump() : "missing")
                    << ", this build reads \"" << kFormat << "\"");
  for (const char* key : {"model", "step", "epoch", "position", "seed", "world", "mode",
                          "optim_steps", "files", "in_channels", "num_classes", "image_size"}) {
    COHORT_CHECK(j.contains(key), path << ": no '" << key << "'");
  }
  // The types every reader below takes for granted (a wrong one would escape as JSON's own
  // exception, naming neither the file nor the field).
  for (const char* key : {"model", "mode"}) {
    COHORT_CHECK(j[key].is_string(),
                 path << ": '" << key << "' is " << j[key].dump() << ", not a string");
  }
  for (const char* key : {"step", "epoch", "position", "seed", "world", "optim_steps",
                          "in_channels", "num_classes", "image_size", "global_batch"}) {
    COHORT_CHECK(!j.contains(key) || j[key].is_number_integer(),
                 path << ": '" << key << "' is " << j[key].dump() << ", not an integer");
  }
  // Read as int64 (int for world): a larger value would wrap into a negative step or world.
  for (const char* key : {"step", "epoch", "world", "optim_steps", "global_batch"}) {
    const bool fits = !j.contains(key) ||
                      (std::string_view(key) == "world" ? holds_whole_number<int>(j[key])
                                                        : holds_whole_number<int64_t>(j[key]));
    COHORT_CHECK(fits, path << ": '" << key << "' is out of range: " << j[key].dump());
  }
  for (const char* key : {"position", "seed", "world", "in_channels", "num_classes"}) {
    COHORT_CHECK(j[key].get<int64_t>() >= 0 || j[key].is_number_unsigned(),
                 path << ": '" << key << "' is negative: " << j[key].dump());
  }
  // Every model has them: a zero would be refused later by the model, naming no file.
  for (const char* key : {"in_channels", "num_classes", "image_size"}) {
    COHORT_CHECK(j[key].is_number_unsigned() && j[key].get<uint64_t>() >= 1 &&
                     j[key].get<uint64_t>() <= 1u << 16,
                 path << ": '" << key << "' is " << j[key].dump() << ", not in 1.." << (1u << 16));
  }
  COHORT_CHECK(j["files"].is_array(), path << ": 'files' is not a list");
  for (const nlohmann::json& f : j["files"]) {
    COHORT_CHECK(f.is_object() && f.contains("path") && f["path"].is_string() &&
                     f.contains("crc32c") && f["crc32c"].is_number_unsigned() &&
                     f["crc32c"].get<uint64_t>() <= 0xffffffffu,
                 path << ": a file entry " << f.dump() << " lacks a path or a CRC-32C");
  }
  if (j.contains("optim_state")) {
    COHORT_CHECK(j["optim_state"].is_array(), path << ": 'optim_state' is not a list");
    for (const nlohmann::json& s : j["optim_state"]) {
      COHORT_CHECK(s.is_string(), path << ": 'optim_state' holds " << s.dump());
    }
  }
  return j;
}

nlohmann::json read_index(const std::string& dir) {
  const std::string path = checkpoint_index(dir);
  COHORT_CHECK(fs::exists(path), "no checkpoint at " << dir << " (cannot read " << path << ")");
  return parse_index(slurp(path), path);
}

RunPosition position_of(const nlohmann::json& index) {
  RunPosition pos;
  pos.step = index["step"].get<int64_t>();
  pos.epoch = index["epoch"].get<int64_t>();
  pos.position = index["position"].get<uint64_t>();
  pos.seed = index["seed"].get<uint64_t>();
  pos.world = index["world"].get<int>();
  pos.mode = index["mode"].get<std::string>();
  pos.global_batch = index.value("global_batch", int64_t{0});
  return pos;
}

// Each file of the index, read and checked against its own CRC and the index's.
nn::SafeTensors read_file(const std::string& dir, const nlohmann::json& f) {
  const std::string path = dir + "/" + f.at("path").get<std::string>();
  nn::SafeTensors st = nn::load_safetensors(path);
  nn::NamedTensors ordered;
  for (auto& [name, t] : st.tensors) ordered.emplace_back(name, t);  // std::map: name order
  const uint32_t crc = crc_of(ordered);
  const uint32_t want = f.at("crc32c").get<uint32_t>();
  COHORT_CHECK(crc == want, path << ": CRC-32C " << crc << " does not match the index's " << want
                                 << " (damaged file)");
  return st;
}

}  // namespace checkpoint_impl

std::string checkpoint_index(const std::string& dir) {
  return dir + "/checkpoint.json";
}

}  // namespace cohort::dist
