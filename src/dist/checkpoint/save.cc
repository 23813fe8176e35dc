// Writing a sharded, crash-safe checkpoint (see checkpoint.h): the previous one is replaced only
// once the new one is complete and verified.
#include "internal.h"

namespace cohort::dist {

using namespace checkpoint_impl;

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

void save_checkpoint(const std::string& dir, nn::Model& m, nn::Optimizer& opt,
                     const RunPosition& pos) {
  save_checkpoint(dir, m, opt, nn::whole_model(m), pos, nullptr, true);
}

}  // namespace cohort::dist
