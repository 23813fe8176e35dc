#include "cohort/dist/checkpoint.h"

#include <filesystem>
#include <fstream>

#include "cohort/data/shards.h"
#include "cohort/dist/ddp.h"
#include "cohort/nn/safetensors.h"

namespace cohort::dist {

namespace {

constexpr const char* kFormat = "cohort-checkpoint-1";

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

}  // namespace

std::string checkpoint_path(const std::string& dir) {
  return dir + "/checkpoint.safetensors";
}

void save_checkpoint(const std::string& dir, const nn::Model& m, nn::Optimizer& opt,
                     const RunPosition& pos) {
  std::filesystem::create_directories(dir);
  nn::NamedTensors ts;
  for (nn::Param* p : m.params()) ts.emplace_back("model." + p->name, p->value);
  for (nn::Buffer* b : m.buffers()) ts.emplace_back("buffer." + b->name, b->value);
  for (auto& [name, t] : opt.state()) ts.emplace_back("optim." + name, *t);
  // Tensors go in name order in the file; the CRC follows the same order.
  std::sort(ts.begin(), ts.end(), [](auto& a, auto& b) { return a.first < b.first; });
  const uint32_t crc = crc_of(ts);
  std::map<std::string, std::string> meta{{"format", kFormat},
                                          {"model", m.name()},
                                          {"step", std::to_string(pos.step)},
                                          {"epoch", std::to_string(pos.epoch)},
                                          {"position", std::to_string(pos.position)},
                                          {"seed", std::to_string(pos.seed)},
                                          {"world", std::to_string(pos.world)},
                                          {"optim_steps", std::to_string(opt.steps())},
                                          {"crc32c", std::to_string(crc)}};
  const std::string path = checkpoint_path(dir);
  nn::save_safetensors(path, ts, meta, [&](const std::string& tmp) {
    const uint32_t got = file_data_crc(tmp);
    COHORT_CHECK(got == crc, "checkpoint " << tmp << " reads back with CRC " << got << ", wrote "
                                           << crc << "; " << path << " is left as it was");
  });
}

RunPosition load_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt) {
  const std::string path = checkpoint_path(dir);
  nn::SafeTensors st = nn::load_safetensors(path);
  auto meta = [&](const char* key) -> const std::string& {
    auto it = st.metadata.find(key);
    COHORT_CHECK(it != st.metadata.end(), path << ": not a Cohort checkpoint (no " << key << ")");
    return it->second;
  };
  COHORT_CHECK(meta("format") == kFormat, path << ": format " << meta("format"));
  COHORT_CHECK(meta("model") == m.name(),
               path << " holds a " << meta("model") << ", this run trains a " << m.name());
  nn::NamedTensors ordered;
  for (auto& [name, t] : st.tensors) ordered.emplace_back(name, t);  // std::map: name order
  const uint32_t crc = crc_of(ordered);
  COHORT_CHECK(std::to_string(crc) == meta("crc32c"), path << ": CRC-32C " << crc
                                                           << " does not match the recorded "
                                                           << meta("crc32c") << " (damaged file)");
  auto take = [&](const std::string& name, nn::Tensor& dst) {
    auto it = st.tensors.find(name);
    COHORT_CHECK(it != st.tensors.end(), path << ": missing " << name);
    COHORT_CHECK(it->second.shape() == dst.shape(),
                 path << ": " << name << " has shape " << tensor::shape_string(it->second.shape())
                      << ", the run wants " << tensor::shape_string(dst.shape()));
    dst.copy_(it->second);
  };
  for (nn::Param* p : m.params()) take("model." + p->name, p->value);
  for (nn::Buffer* b : m.buffers()) take("buffer." + b->name, b->value);
  for (auto& [name, t] : opt.state()) take("optim." + name, *t);
  opt.set_steps(std::stoll(meta("optim_steps")));
  RunPosition pos;
  pos.step = std::stoll(meta("step"));
  pos.epoch = std::stoll(meta("epoch"));
  pos.position = std::stoull(meta("position"));
  pos.seed = std::stoull(meta("seed"));
  pos.world = std::stoi(meta("world"));
  return pos;
}

RunPosition resume_from_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt,
                                   comm::Communicator* world) {
  RunPosition pos;
  if (!world || world->rank() == 0) pos = load_checkpoint(dir, m, opt);
  if (!world || world->size() == 1) return pos;
  int64_t f[6] = {
      pos.step,  pos.epoch,  static_cast<int64_t>(pos.position), static_cast<int64_t>(pos.seed),
      pos.world, opt.steps()};
  world->broadcast(f, f, 6, comm::DataType::i64, 0).wait();
  pos.step = f[0];
  pos.epoch = f[1];
  pos.position = static_cast<uint64_t>(f[2]);
  pos.seed = static_cast<uint64_t>(f[3]);
  pos.world = static_cast<int>(f[4]);
  opt.set_steps(f[5]);
  broadcast_parameters(m, *world);
  broadcast_buffers(m, *world);
  for (auto& [name, t] : opt.state()) {
    world->broadcast(t->raw(), t->raw(), static_cast<size_t>(t->numel()), comm::DataType::f32, 0)
        .wait();
  }
  return pos;
}

}  // namespace cohort::dist
