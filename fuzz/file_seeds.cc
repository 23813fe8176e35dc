// Writes the committed seed corpus of fuzz_files (fuzz/corpus/files): one valid file of each
// kind, made by Cohort's own writers where it has one (safetensors, shards, checkpoints, cluster
// files, profiles), each prefixed with the byte that selects its reader. Rerun after a format
// change:
//   build-fuzz/bin/file_seeds fuzz/corpus/files
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cohort/data/shards.h"
#include "cohort/data/source.h"
#include "cohort/dist/checkpoint.h"
#include "cohort/nn/safetensors.h"
#include "cohort/plan/plan.h"
#include "file_inputs.h"

using namespace cohort;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void seed(const std::string& out, const std::string& name, fuzz::FileKind kind,
          const std::string& bytes) {
  std::ofstream f(out + "/seed-" + name, std::ios::binary | std::ios::trunc);
  f.put(static_cast<char>(kind));
  f << bytes;
  std::cout << "seed-" << name << ": " << bytes.size() + 1 << " bytes\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: file_seeds OUT_DIR\n";
    return 2;
  }
  const std::string out = argv[1];
  const std::string work =
      fs::temp_directory_path() / ("cohort-file-seeds-" + std::to_string(::getpid()));
  fs::create_directories(out);
  fs::create_directories(work);

  // safetensors: every dtype Cohort reads, with metadata.
  {
    nn::NamedTensors ts;
    ts.emplace_back("conv.weight", nn::Tensor::full({2, 3}, 0.5f));
    ts.emplace_back("scale", nn::Tensor::zeros({4}, nn::DType::bf16));
    ts.emplace_back("steps", nn::Tensor::zeros({1}, nn::DType::i64));
    ts.emplace_back("mask", nn::Tensor::zeros({3}, nn::DType::u8));
    nn::save_safetensors(work + "/w.safetensors", ts, {{"format", "pt"}});
    seed(out, "safetensors", fuzz::FileKind::safetensors, slurp(work + "/w.safetensors"));
  }
  // A record shard of three small files with labels.
  {
    std::vector<data::Sample> samples;
    for (int i = 0; i < 3; ++i) {
      const std::string p = work + "/sample-" + std::to_string(i) + ".bin";
      std::ofstream(p) << std::string(static_cast<size_t>(10 + i), static_cast<char>('a' + i));
      samples.push_back({p, {i % 2}});
    }
    data::PackOptions po;
    po.out = work + "/shards";
    data::pack(*data::file_source(samples, {"normal", "finding"}), po);
    for (const auto& e : fs::directory_iterator(po.out)) {
      seed(out, "shard", fuzz::FileKind::shard, slurp(e.path().string()));
    }
  }
  // A checkpoint of the small CNN under SGD with momentum: its index, renamed to read its one
  // piece file from "piece.safetensors", and that file.
  {
    nn::ModelOptions mo;
    mo.in_channels = 1;
    mo.num_classes = 2;
    mo.image_size = 16;
    auto m = nn::make_model("smallcnn", mo);
    auto opt = nn::make_optimizer(*m, nn::OptimOptions{});
    dist::RunPosition pos;
    pos.step = 3;
    pos.position = 24;
    pos.seed = 7;
    pos.global_batch = 8;
    const std::string dir = work + "/checkpoint";
    dist::save_checkpoint(dir, *m, *opt, pos);
    nlohmann::json index = nlohmann::json::parse(slurp(dist::checkpoint_index(dir)));
    const std::string piece = slurp(dir + "/" + index["files"][0]["path"].get<std::string>());
    index["files"][0]["path"] = "piece.safetensors";
    seed(out, "checkpoint", fuzz::FileKind::checkpoint,
         index.dump(1) + fuzz::kCheckpointSeparator + piece);
  }
  seed(out, "config-toml", fuzz::FileKind::config_toml,
       "model = \"resnet18\"\ndata = \"scans/train.csv\"\nepochs = 2\nbatch = 16\nlr = 0.1\n"
       "optimizer = \"adamw\"\nschedule = \"cosine\"\nin-channels = 1\nnum-classes = 4\n"
       "image-size = 224\nhflip = false\nwindow-center = 40\nwindow-width = 400\n"
       "shard = \"zero2\"\nmax-memory = \"8G\"\nsync-bn = true\naccum-steps = 2\n"
       "clip-grad-norm = 1.0\n");
  seed(out, "config-json", fuzz::FileKind::config_json,
       R"({"model": "densenet121", "batch": 8, "lr": 0.05, "pipeline-stages": 2,)"
       R"( "micro-batches": 4, "pipeline-schedule": "1f1b", "deferred-batch-norm": true})");
  seed(out, "csv-list", fuzz::FileKind::csv_list, "path,label\na.png,0\nsub/b.dcm,1\n");
  seed(out, "csv-findings", fuzz::FileKind::csv_list,
       "path,Atelectasis,Effusion\na.png,1,0\nb.png,0,0\nc.png,1,1\n");
  {
    plan::write_cluster(plan::preset_cluster("dgx-a100"), work + "/cluster.json");
    seed(out, "cluster-json", fuzz::FileKind::cluster_json, slurp(work + "/cluster.json"));
  }
  seed(out, "cluster-toml", fuzz::FileKind::cluster_toml, "base = \"dgx-h100\"\nnodes = 4\n");
  {
    plan::write_profile(plan::builtin_profile("resnet18", 64), work + "/profile.json");
    seed(out, "profile", fuzz::FileKind::profile, slurp(work + "/profile.json"));
  }
  // Training logs as cohort report reads them (cohort train --json, cohort bench train --json):
  // every field it reads, with the nulls the logs write for undefined figures.
  seed(out, "run-log", fuzz::FileKind::run_log,
       R"({"config":{"model":"smallcnn","precision":"f32","pipeline-stages":"0"},"world":2,)"
       R"("global_batch":16,"shard":"zero2","steps":[{"step":1,"epoch":0,"loss":0.74,"lr":0.05,)"
       R"("compute_s":0.012,"comm_wait_s":0.002,"data_wait_s":0.001,"images_per_s":1066.7},)"
       R"({"step":2,"epoch":0,"loss":0.69,"lr":null,"compute_s":0.011,"comm_wait_s":0.002,)"
       R"("data_wait_s":0.0,"images_per_s":null}],"epochs":[{"epoch":0,"train_loss":0.71,)"
       R"("steps":2,"val_loss":0.68,"val_accuracy":null,"val_auc":0.71,)"
       R"("val_auc_per_finding":{"Atelectasis":0.66,"Effusion":null}}],)"
       R"("summary":{"images_per_s":980.5,"compute_ms":11.5,"comm_wait_ms":2.0,)"
       R"("data_wait_ms":0.5},"memory":[{"parameters":4096,"gradients":4096,)"
       R"("optimizer_state":2048,"gathered_peak":0,"gradients_in_flight_peak":1024,)"
       R"("activations_peak":65536,"comm_buffers_peak":8192,"allocator_cache_peak":4096,)"
       R"("peak_rss":50000000.0}]})");
  seed(out, "run-log-bench", fuzz::FileKind::run_log,
       R"({"model":"resnet18","precision":"bf16","world":1,"batch":8,"images_per_s":120.5,)"
       R"("ms_per_step":66.4,"shard":"none","ms_comm_wait":0.0,"ms_each":[70.1,64.2,65.0],)"
       R"("memory":[{"parameters":1000,"gradients":1000,"optimizer_state":1000,)"
       R"("gathered_peak":0,"gradients_in_flight_peak":0,"activations_peak":1000,)"
       R"("comm_buffers_peak":0,"allocator_cache_peak":0,"peak_rss":9000}]})");
  fs::remove_all(work);
  return 0;
}
