// Reading a checkpoint into any layout, resharding as needed, and sharing it across hosts (see
// checkpoint.h).
#include "internal.h"

namespace cohort::dist {

using namespace checkpoint_impl;

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

RunPosition load_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt) {
  return load_checkpoint(dir, m, &opt, nn::whole_model(m));
}

}  // namespace cohort::dist
