// Describing and consolidating a checkpoint (cohort checkpoint inspect|consolidate).
#include "internal.h"

namespace cohort::dist {

using namespace checkpoint_impl;

std::string describe_checkpoint(const std::string& dir) {
  const nlohmann::json index = read_index(dir);
  std::ostringstream os;
  const std::string mode = index["mode"].get<std::string>();  // a --shard mode or pipeline-SxD
  os << dir << ": " << index["model"].get<std::string>() << " (" << index["in_channels"]
     << " input channels, " << index["num_classes"] << " classes), step " << index["step"]
     << " (epoch " << index["epoch"] << ", sample " << index["position"] << "), written by "
     << index["world"] << " rank(s) under "
     << (mode.rfind("pipeline", 0) == 0 ? mode : "--shard " + mode) << ", optimizer state:";
  if (index.contains("optim_state")) {
    for (const auto& s : index["optim_state"]) os << " " << s.get<std::string>();
  }
  os << "\n";
  // name -> elements, pieces, and the bytes per file
  std::map<std::string, std::pair<size_t, size_t>> tensors;
  for (const nlohmann::json& f : index["files"]) {
    const std::string file = f.at("path").get<std::string>();
    const nn::SafeTensors st = read_file(dir, f);
    size_t bytes = 0;
    for (const auto& [name, t] : st.tensors) {
      bytes += t.bytes();
      const size_t open = name.rfind('[');
      const std::string base = open == std::string::npos ? name : name.substr(0, open);
      auto& e = tensors[base];
      e.first += static_cast<size_t>(t.numel());
      e.second += 1;
    }
    os << "  " << file << ": " << st.tensors.size() << " tensors, " << bytes << " bytes, CRC-32C "
       << f.at("crc32c") << "\n";
  }
  for (const auto& [name, e] : tensors) {
    os << "  " << name << ": " << e.first << " elements in " << e.second << " piece(s)\n";
  }
  return os.str();
}

void consolidate_checkpoint(const std::string& dir, const std::string& out) {
  const nlohmann::json index = read_index(dir);
  nn::ModelOptions o;
  o.in_channels = index["in_channels"].get<int>();
  o.num_classes = index["num_classes"].get<int>();
  o.image_size = index["image_size"].get<int>();
  std::unique_ptr<nn::Model> m;
  try {
    m = nn::make_model(index["model"].get<std::string>(), o);
  } catch (const Error& e) {
    COHORT_THROW(checkpoint_index(dir) << ": " << e.message());
  }
  const RunPosition pos = load_checkpoint(dir, *m, nullptr, nn::whole_model(*m));
  nn::save_weights(*m, out,
                   {{"classes", std::to_string(o.num_classes)},
                    {"in_channels", std::to_string(o.in_channels)},
                    {"steps", std::to_string(pos.step)}});
}

}  // namespace cohort::dist
