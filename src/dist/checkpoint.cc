// Sharded, crash-safe checkpoints (see checkpoint.h): writing the pieces, the index, loading
// with resharding, inspecting and consolidating.
#include "cohort/dist/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
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

namespace {

constexpr const char* kFormat = "cohort-checkpoint-2";

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

// Each rank's host, named by the lowest rank on it: ranks of one host share its disk, ranks of
// different hosts may not (no shared file system is assumed).
std::vector<int> hosts_of_ranks(comm::Communicator& w) {
  const int64_t mine = static_cast<int64_t>(std::hash<std::string>{}(w.host()));
  std::vector<int64_t> all(static_cast<size_t>(w.size()));
  w.allgather(&mine, all.data(), 1, comm::DataType::i64).wait();
  std::vector<int> host(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    host[r] = static_cast<int>(std::find(all.begin(), all.end(), all[r]) - all.begin());
  }
  return host;
}

// The rank that keeps a copy of rank r's file: on the next host (hosts in the order of their
// lowest ranks, the last followed by the first), the rank at r's place among its host's ranks,
// or that host's last rank. r itself when there is one host.
int keeper_of(int r, const std::vector<int>& host) {
  std::vector<int> leads;
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] == static_cast<int>(i)) leads.push_back(static_cast<int>(i));
  }
  if (leads.size() < 2) return r;
  const size_t at =
      static_cast<size_t>(std::find(leads.begin(), leads.end(), host[r]) - leads.begin());
  const int next = leads[(at + 1) % leads.size()];
  int place = 0;
  for (int i = 0; i < r; ++i) place += host[i] == host[r];
  int keeper = next;
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] != next) continue;
    keeper = static_cast<int>(i);
    if (place-- == 0) break;
  }
  return keeper;
}

// A checkpoint file carried from the rank that holds it to ranks that write it, in pieces of
// kPassPiece bytes through one reused buffer: `move` carries a piece from the holder to the others
// (a send and a receive, or a broadcast), and every rank taking part calls it alike. A ResNet-18
// file (89 MB) read whole, sent whole and received into a fresh buffer took 1.96-2.23 s per
// checkpoint between two emulated hosts here (the read alone 0.95 s); in pieces 0.35-0.84 s.
// Returns the file's size; a holder that cannot read its file passes -1. A writer takes every
// piece the holder sends even after its own write failed, so that no rank is left waiting.
// Errors go to `error`: the read, the write, or the CRC-32C check against `crc`.
constexpr size_t kPassPiece = size_t{8} << 20;

int64_t pass_file(const std::function<void(void*, size_t)>& move, int holder, bool holds,
                  const std::string& src, bool writes, const std::string& dst, uint32_t crc,
                  std::string* error) {
  int fd = -1;
  // Closed however this returns: a peer lost mid-pass throws out of `move`.
  const std::unique_ptr<int, void (*)(int*)> close_fd(&fd, [](int* f) {
    if (*f >= 0) ::close(*f);
  });
  int64_t n = -1;
  if (holds) {
    fd = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0) {
      n = static_cast<int64_t>(st.st_size);
    } else {
      *error = "cannot read " + src + ": " + errno_string(errno);
    }
  }
  move(&n, sizeof n);
  if (n < 0) {
    if (!holds)
      *error = "rank " + std::to_string(holder) + " could not read the file it was to pass (" +
               dst + ')';
    return n;
  }
  std::vector<char> piece(std::min(kPassPiece, static_cast<size_t>(n)));
  int64_t moved = 0;
  auto pieces = [&](const nn::ByteSink* sink) {
    while (moved < n) {
      const size_t len = static_cast<size_t>(std::min<int64_t>(n - moved, piece.size()));
      if (holds) {
        size_t got = 0;
        while (got < len) {
          const ssize_t r = ::pread(fd, piece.data() + got, len - got, moved + got);
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0) {  // the file shrank or failed: the rest goes as zeros, which the CRC refuses
            if (error->empty()) {
              *error = "reading " + src + " at byte " + std::to_string(moved + got) + ": " +
                       (r < 0 ? errno_string(errno) : std::string("the file ends early"));
            }
            std::fill(piece.begin() + got, piece.begin() + len, 0);
            break;
          }
          got += static_cast<size_t>(r);
        }
      }
      move(piece.data(), len);
      moved += static_cast<int64_t>(len);
      if (sink) (*sink)(piece.data(), len);
    }
  };
  if (writes) {
    try {
      fs::create_directories(fs::path(dst).parent_path());
      nn::write_stream_atomically(
          dst, [&](const nn::ByteSink& sink) { pieces(&sink); },
          [&](const std::string& tmp) {
            const uint32_t got = file_data_crc(tmp);
            COHORT_CHECK(got == crc,
                         tmp << " arrived with CRC " << got << ", the writer's is " << crc);
          });
    } catch (const CommError&) {
      throw;  // the holder is gone: nothing more comes
    } catch (const std::exception& e) {
      *error = e.what();
      pieces(nullptr);  // the rest of what the holder sends
    }
  } else {
    pieces(nullptr);
  }
  return n;
}

// pass_file from rank `from` to rank `to` (a send and a receive); other ranks do nothing.
int64_t pass_file_to(comm::Communicator& w, int from, int to, const std::string& src,
                     const std::string& dst, uint32_t crc, std::string* error) {
  if (w.rank() != from && w.rank() != to) return 0;
  const auto move = [&](void* p, size_t len) {
    if (w.rank() == from) {
      w.send(p, len, comm::DataType::u8, to).wait();
    } else {
      w.recv(p, len, comm::DataType::u8, from).wait();
    }
  };
  return pass_file(move, from, w.rank() == from, src, w.rank() == to, dst, crc, error);
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

// Rank `root`'s bytes on every rank.
std::string broadcast_bytes(comm::Communicator& w, int root, std::string bytes) {
  int64_t n = static_cast<int64_t>(bytes.size());
  w.broadcast(&n, &n, 1, comm::DataType::i64, root).wait();
  bytes.resize(static_cast<size_t>(n));
  w.broadcast(bytes.data(), bytes.data(), bytes.size(), comm::DataType::u8, root).wait();
  return bytes;
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

}  // namespace

std::string checkpoint_index(const std::string& dir) {
  return dir + "/checkpoint.json";
}

void save_checkpoint(const std::string& dir, const nn::Model& m, nn::Optimizer& opt,
                     const nn::OptimTarget& t, const RunPosition& pos, comm::Communicator* world,
                     bool replicated) {
  const int rank = world ? world->rank() : 0;
  const int size = world ? world->size() : 1;
  std::error_code index_error;  // an unreadable folder counts as holding none
  const bool had_one = fs::exists(checkpoint_index(dir), index_error);
  // A directory of its own for this checkpoint's files, named by rank 0.
  int64_t id = now_us() % 1000000000;
  if (world) world->broadcast(&id, &id, 1, comm::DataType::i64, 0).wait();
  const std::string sub = "step-" + std::to_string(pos.step) + "-" + std::to_string(id);
  const bool writes = !replicated || rank == 0;
  const std::string file = sub + "/rank-" + std::to_string(rank) + ".safetensors";

  // [written, crc]; a failed write is reported to every rank instead of leaving them waiting.
  int64_t mine[2] = {0, 0};
  std::string error;
  if (writes) {
    try {
      fs::create_directories(dir + "/" + sub);
      nn::NamedTensors ts;
      auto state = opt.state();
      for (const nn::ParamPiece& p : t.pieces) {
        const nn::Param* param = m.params()[static_cast<size_t>(p.param)];
        const nn::FlatRange& r = t.ranges[p.range];
        const int64_t n = static_cast<int64_t>(p.hi - p.lo);
        ts.emplace_back(piece_name("model.", param->name, p.lo, p.hi),
                        nn::Tensor::wrap(r.w + p.at, {n}, tensor::DType::f32));
        for (auto& [sname, st] : state) {
          float* base = st->data<float>() + t.state_at(p.range) + p.at;
          ts.emplace_back(piece_name("optim." + sname + ".", param->name, p.lo, p.hi),
                          nn::Tensor::wrap(base, {n}, tensor::DType::f32));
        }
      }
      if (rank == 0)
        for (nn::Buffer* b : m.buffers()) ts.emplace_back("buffer." + b->name, b->value);
      std::sort(ts.begin(), ts.end(), [](auto& a, auto& b) { return a.first < b.first; });
      const uint32_t crc = crc_of(ts);
      const std::string path = dir + "/" + file;
      nn::save_safetensors(
          path, ts, {{"format", kFormat}, {"crc32c", std::to_string(crc)}},
          [&](const std::string& tmp) {
            const uint32_t got = file_data_crc(tmp);
            COHORT_CHECK(got == crc, tmp << " reads back with CRC " << got << ", wrote " << crc);
          });
      mine[0] = 1;
      mine[1] = crc;
    } catch (const std::exception& e) {
      error = e.what();
      mine[0] = -1;
    }
  }
  std::vector<int64_t> all(2 * static_cast<size_t>(size));
  if (world) {
    world->allgather(mine, all.data(), 2, comm::DataType::i64).wait();
  } else {
    all.assign(mine, mine + 2);
  }
  for (int r = 0; r < size; ++r) {
    if (all[2 * static_cast<size_t>(r)] < 0) {
      COHORT_THROW("checkpoint at step " << pos.step << ": rank " << r
                                         << " could not write its shard"
                                         << (r == rank ? ": " + error : std::string()) << "; "
                                         << what_is_kept(dir, had_one));
    }
  }

  // A copy of each file on another host, unless that host already sees it (a shared file
  // system), so that losing one host loses no shard; each host then gets its own index.
  const std::vector<int> host = world ? hosts_of_ranks(*world) : std::vector<int>{0};
  const bool hosts_apart = *std::max_element(host.begin(), host.end()) > 0;
  if (hosts_apart) {
    std::vector<int64_t> needed(static_cast<size_t>(size), 0);
    for (int r = 0; r < size; ++r) {
      const std::string theirs = sub + "/rank-" + std::to_string(r) + ".safetensors";
      if (all[2 * static_cast<size_t>(r)] == 1 && keeper_of(r, host) == rank) {
        needed[static_cast<size_t>(r)] = !fs::exists(dir + "/" + theirs);
      }
    }
    world
        ->allreduce(needed.data(), needed.data(), needed.size(), comm::DataType::i64,
                    comm::RedOp::max)
        .wait();
    int64_t copied = 0;  // -1: a copy this rank sent or kept failed
    std::string copy_error;
    for (int r = 0; r < size; ++r) {
      if (!needed[static_cast<size_t>(r)]) continue;
      const int keeper = keeper_of(r, host);
      const std::string theirs = sub + "/rank-" + std::to_string(r) + ".safetensors";
      std::string e;
      pass_file_to(*world, r, keeper, dir + "/" + file, dir + "/" + theirs,
                   static_cast<uint32_t>(all[2 * static_cast<size_t>(r) + 1]), &e);
      if (e.empty()) continue;
      copied = -1;
      copy_error = rank == keeper
                       ? "rank " + std::to_string(rank) + " could not keep the copy of rank " +
                             std::to_string(r) + "'s shard: " + e
                       : e;
    }
    int64_t worst = copied;
    world->allreduce(&copied, &worst, 1, comm::DataType::i64, comm::RedOp::min).wait();
    COHORT_CHECK(worst >= 0,
                 "checkpoint at step "
                     << pos.step << ": "
                     << (copy_error.empty() ? "a copy on another host failed (see its rank's log)"
                                            : copy_error)
                     << "; " << what_is_kept(dir, had_one));
  }

  std::string index_text;
  if (rank == 0) {
    nlohmann::json files = nlohmann::json::array();
    for (int r = 0; r < size; ++r) {
      if (all[2 * static_cast<size_t>(r)] != 1) continue;
      files.push_back({{"path", sub + "/rank-" + std::to_string(r) + ".safetensors"},
                       {"rank", r},
                       {"crc32c", static_cast<uint32_t>(all[2 * static_cast<size_t>(r) + 1])}});
    }
    std::vector<std::string> states;
    for (auto& [sname, st] : opt.state()) states.push_back(sname);
    nlohmann::json index = {{"format", kFormat},
                            {"model", m.name()},
                            {"in_channels", m.options().in_channels},
                            {"num_classes", m.options().num_classes},
                            {"image_size", m.options().image_size},
                            {"step", pos.step},
                            {"epoch", pos.epoch},
                            {"position", pos.position},
                            {"seed", pos.seed},
                            {"world", pos.world},
                            {"global_batch", pos.global_batch},
                            {"mode", pos.mode},
                            {"optim_steps", opt.steps()},
                            {"optim_state", states},
                            {"files", files}};
    index_text = index.dump(1) + "\n";
  }
  if (hosts_apart) index_text = broadcast_bytes(*world, 0, index_text);
  // The first rank of each host writes the index there, last (a host that neither wrote nor
  // kept a file gets the index alone; a restart fetches the files, see share_checkpoint).
  if (host[static_cast<size_t>(rank)] == rank) {
    try {
      fs::create_directories(dir);
      nn::write_file_atomically(checkpoint_index(dir), {{index_text.data(), index_text.size()}});
    } catch (const std::exception& e) {
      COHORT_THROW("checkpoint at step " << pos.step << ": writing its index: " << e.what() << "; "
                                         << what_is_kept(dir, had_one));
    }
    // The index names the new files: the older ones (and any a crash left half-written) go.
    // On a file system the hosts share, their first ranks may be removing the same ones.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (e.is_directory(ec) && name.rfind("step-", 0) == 0 && name != sub) {
        fs::remove_all(e.path(), ec);
      }
    }
  }
  if (world) world->barrier().wait();
}

RunPosition load_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer* opt,
                            const nn::OptimTarget& t) {
  const nlohmann::json index = read_index(dir);
  const std::string path = checkpoint_index(dir);
  COHORT_CHECK(index["model"] == m.name(), path << " holds a " << index["model"].get<std::string>()
                                                << ", this run trains a " << m.name());
  // What this rank needs, by parameter name: its pieces, and how much of each was found.
  std::map<std::string, std::vector<size_t>> wanted;  // name -> indices into t.pieces
  for (size_t i = 0; i < t.pieces.size(); ++i) {
    wanted[m.params()[static_cast<size_t>(t.pieces[i].param)]->name].push_back(i);
  }
  std::vector<std::pair<std::string, nn::Tensor*>> state;
  if (opt) state = opt->state();
  std::vector<std::vector<size_t>> found(1 + state.size(), std::vector<size_t>(t.pieces.size(), 0));
  size_t buffers_found = 0;

  // Copies the overlap of a saved piece [lo, hi) of `param` into every piece this rank needs.
  auto place = [&](const std::string& file, const std::string& param, size_t lo, size_t hi,
                   const nn::Tensor& src, int which) {
    auto it = wanted.find(param);
    if (it == wanted.end()) {
      COHORT_CHECK(m.find_param(param) != nullptr,
                   file << ": parameter " << param << " is not in " << m.name());
      return;
    }
    COHORT_CHECK(src.numel() == static_cast<int64_t>(hi - lo), file << ": piece " << param << "["
                                                                    << lo << ":" << hi << "] holds "
                                                                    << src.numel() << " elements");
    for (size_t i : it->second) {
      const nn::ParamPiece& p = t.pieces[i];
      const size_t a = std::max(lo, p.lo), b = std::min(hi, p.hi);
      if (a >= b) continue;
      float* dst = which == 0 ? t.ranges[p.range].w + p.at
                              : state[static_cast<size_t>(which - 1)].second->data<float>() +
                                    t.state_at(p.range) + p.at;
      std::memcpy(dst + (a - p.lo), src.data<float>() + (a - lo), (b - a) * sizeof(float));
      found[static_cast<size_t>(which)][i] += b - a;
    }
  };

  for (const nlohmann::json& f : index["files"]) {
    const std::string file = dir + "/" + f.at("path").get<std::string>();
    const nn::SafeTensors st = read_file(dir, f);
    for (const auto& [name, tensor] : st.tensors) {
      std::string param;
      size_t lo = 0, hi = 0;
      if (parse_piece(name, "model.", &param, &lo, &hi)) {
        place(file, param, lo, hi, tensor, 0);
        continue;
      }
      bool placed = false;
      for (size_t s = 0; s < state.size() && !placed; ++s) {
        if (parse_piece(name, "optim." + state[s].first + ".", &param, &lo, &hi)) {
          place(file, param, lo, hi, tensor, static_cast<int>(s + 1));
          placed = true;
        }
      }
      if (placed || name.rfind("optim.", 0) == 0) continue;  // another optimiser's state: below
      if (name.rfind("buffer.", 0) == 0) {
        nn::Buffer* b = m.find_buffer(name.substr(7));
        COHORT_CHECK(b, file << ": buffer " << name.substr(7) << " is not in " << m.name());
        COHORT_CHECK(b->value.shape() == tensor.shape(),
                     file << ": " << name << " has shape " << tensor::shape_string(tensor.shape())
                          << ", the run wants " << tensor::shape_string(b->value.shape()));
        b->value.copy_(tensor);
        ++buffers_found;
        continue;
      }
      COHORT_THROW(file << ": unexpected tensor " << name);
    }
  }
  // Every element this rank needs must have been in some file.
  for (size_t w = 0; w < found.size(); ++w) {
    for (size_t i = 0; i < t.pieces.size(); ++i) {
      const nn::ParamPiece& p = t.pieces[i];
      const std::string what = w == 0 ? "values" : "optimizer state '" + state[w - 1].first + "'";
      COHORT_CHECK(found[w][i] == p.hi - p.lo,
                   path << ": " << what << " of " << m.params()[static_cast<size_t>(p.param)]->name
                        << "[" << p.lo << ":" << p.hi << "] missing (" << found[w][i] << " of "
                        << p.hi - p.lo << " elements found; was it written by another optimizer?)");
    }
  }
  COHORT_CHECK(buffers_found == m.buffers().size(),
               path << ": " << buffers_found << " of " << m.buffers().size() << " buffers found");
  if (opt) opt->set_steps(index["optim_steps"].get<int64_t>());
  return position_of(index);
}

SharedCheckpoint share_checkpoint(const std::string& dir, comm::Communicator* world) {
  const std::string index_path = checkpoint_index(dir);
  const bool have = fs::exists(index_path);
  SharedCheckpoint out;
  if (!world || world->size() == 1) {
    out.found = have;
    if (have) out.step = read_index(dir)["step"].get<int64_t>();
    return out;
  }
  const std::vector<int> host = hosts_of_ranks(*world);
  const int rank = world->rank();
  // The newest index any rank reads (-1: none; -2: damaged, which another host's may replace).
  int64_t step = -1;
  std::string text, damage;
  if (have) {
    try {
      text = slurp(index_path);
      step = parse_index(text, index_path)["step"].get<int64_t>();
    } catch (const std::exception& e) {
      step = -2;
      damage = e.what();
    }
  }
  std::vector<int64_t> steps(static_cast<size_t>(world->size()));
  world->allgather(&step, steps.data(), 1, comm::DataType::i64).wait();
  const int64_t best = *std::max_element(steps.begin(), steps.end());
  if (best == -2) {
    COHORT_CHECK(step != -2, damage);
    COHORT_THROW(dir << ": rank " << std::find(steps.begin(), steps.end(), -2) - steps.begin()
                     << "'s checkpoint index is damaged and no rank has another");
  }
  if (best < 0) return out;
  out.found = true;
  out.step = best;
  const int source = static_cast<int>(std::find(steps.begin(), steps.end(), best) - steps.begin());
  text = broadcast_bytes(*world, source, step == best ? text : std::string());
  const nlohmann::json index =
      parse_index(text, index_path + " (rank " + std::to_string(source) + "'s)");

  // Which rank sees which file.
  const nlohmann::json& files = index["files"];
  std::vector<uint8_t> mine(files.size()), seen(files.size() * host.size());
  for (size_t f = 0; f < files.size(); ++f) {
    mine[f] = fs::exists(dir + "/" + files[f]["path"].get<std::string>());
  }
  world->allgather(mine.data(), seen.data(), mine.size(), comm::DataType::u8).wait();
  int64_t ok = 1;
  std::string error;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string name = files[f]["path"].get<std::string>();
    int holder = -1;
    bool lacking = false;
    for (size_t r = 0; r < host.size(); ++r) {
      if (seen[r * files.size() + f] && holder < 0) holder = static_cast<int>(r);
      lacking = lacking || !seen[r * files.size() + f];
    }
    COHORT_CHECK(holder >= 0, dir << ": the checkpoint at step " << best << " names " << name
                                  << ", which no rank's host holds (was it written by more than "
                                     "one host that is gone?)");
    if (!lacking) continue;
    // Every rank takes part in the broadcast; the first rank of each host that lacks the file
    // writes it there.
    std::string e;
    const int64_t n = pass_file(
        [&](void* p, size_t len) {
          world->broadcast(p, p, len, comm::DataType::u8, holder).wait();
        },
        holder, rank == holder, dir + "/" + name,
        !mine[f] && host[static_cast<size_t>(rank)] == rank, dir + "/" + name,
        files[f]["crc32c"].get<uint32_t>(), &e);
    if (!e.empty()) {
      ok = -1;
      error = e;
    }
    out.files_passed += 1;
    out.bytes_passed += static_cast<uint64_t>(std::max<int64_t>(n, 0));
  }
  // Then the index, where it is older or missing.
  if (ok == 1 && step != best && host[static_cast<size_t>(rank)] == rank) {
    try {
      fs::create_directories(dir);
      nn::write_file_atomically(index_path, {{text.data(), text.size()}});
    } catch (const std::exception& e) {
      ok = -1;
      error = e.what();
    }
  }
  int64_t worst = ok;
  world->allreduce(&ok, &worst, 1, comm::DataType::i64, comm::RedOp::min).wait();
  COHORT_CHECK(worst == 1,
               dir << ": fetching the checkpoint at step " << best << " from other hosts failed"
                   << (error.empty() ? " on another rank (see its log)" : ": " + error));
  return out;
}

RunPosition read_checkpoint_position(const std::string& dir) {
  const nlohmann::json index = read_index(dir);
  return position_of(index);
}

void save_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt,
                     const RunPosition& pos) {
  save_checkpoint(dir, m, opt, nn::whole_model(m), pos, nullptr, true);
}

RunPosition load_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt) {
  return load_checkpoint(dir, m, &opt, nn::whole_model(m));
}

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
