// `cohort plan --calibrate FILE`: measures this machine and writes a cluster file for it. Each
// measurement runs this same binary (`cohort bench train`, `cohort bench comm` under `cohort
// launch`, `make-dataset` and `bench data`) with its output in a log, and reads its JSON.
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/plan/plan.h"
#include "plan_calibrate.h"

namespace cohort::cli {

namespace {

namespace fs = std::filesystem;

struct Workdir {
  fs::path dir;
  Workdir() {
    char tmpl[] = "/tmp/cohort-calibrate-XXXXXX";
    COHORT_CHECK(mkdtemp(tmpl), "cannot make a folder under /tmp: " << std::strerror(errno));
    dir = tmpl;
  }
  ~Workdir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

std::string self() {
  return fs::read_symlink("/proc/self/exe").string();
}

// Runs this binary with `args`, output into `log`; returns the JSON it wrote to `json` (none
// when `json` is empty).
nlohmann::json run(const std::string& what, const std::string& args, const fs::path& log,
                   const fs::path& json) {
  const std::string cmd = "timeout 300 '" + self() + "' " + args + " > '" + log.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream f(log);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (text.size() > 2000) text = text.substr(text.size() - 2000);
    COHORT_THROW("calibration step '" << what << "' failed (exit " << rc << "):\n" << text);
  }
  if (json.empty()) return {};
  std::ifstream f(json);
  COHORT_CHECK(f, "calibration step '" << what << "' wrote no " << json.string());
  return nlohmann::json::parse(f);
}

// One core's copy bandwidth over a buffer far larger than the caches, GB/s (best of 5).
double copy_gbytes_per_s() {
  const size_t n = size_t{256} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(n) / s / 1e9);  // read + write
    a[static_cast<size_t>(i)] = b[static_cast<size_t>(i) + 1];
  }
  return best;
}

}  // namespace

plan::Cluster calibrate_this_machine() {
  Workdir w;
  plan::Cluster c = plan::preset_cluster("cpu-host");
  c.name = "this machine";
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  c.cpu_cores = static_cast<int>(std::max(1L, cores));
  c.accelerators_per_node = c.cpu_cores;
  c.accelerator.name = "one core of this machine";

  std::printf("[1/4] compute: resnet18, 16 images of 128 px per step, one thread, 12 steps\n");
  std::fflush(stdout);
  const nlohmann::json t =
      run("bench train",
          "bench train --model resnet18 --batch 16 --image-size 128 --steps 12 --warmup 2 "
          "--threads 1 --no-profile --json '" +
              (w.dir / "train.json").string() + "'",
          w.dir / "train.log", w.dir / "train.json");
  const double ips = t.at("images_per_s").get<double>();
  std::vector<double> each = t.at("ms_each").get<std::vector<double>>();
  double mean = 0, var = 0;
  for (double v : each) mean += v / static_cast<double>(each.size());
  for (double v : each) var += (v - mean) * (v - mean) / static_cast<double>(each.size());
  c.step_jitter = std::min(0.5, std::sqrt(var) / mean);
  plan::Strategy s;
  s.batch = 16;
  s.bf16 = false;
  c.accelerator.compute_efficiency = 0.45;
  c.accelerator.memory_efficiency = 0.6;

  std::printf("      %.1f images/s, step time spread %.1f%%\n", ips, 100 * c.step_jitter);
  std::printf("[2/4] memory bandwidth of one core\n");
  std::fflush(stdout);
  c.accelerator.memory_gbs = copy_gbytes_per_s();
  c.accelerator.memory_gib = 0;
  {
    std::ifstream mi("/proc/meminfo");
    std::string key;
    double kb = 0;
    while (mi >> key >> kb) {
      if (key == "MemTotal:") break;
      mi.ignore(256, '\n');
    }
    c.accelerator.memory_gib = kb / (1024.0 * 1024) / static_cast<double>(c.accelerators_per_node);
  }
  // The compute peak that makes the model, at its default efficiencies and the memory bandwidth
  // just measured, run resnet18 as measured.
  c = plan::match_throughput(plan::builtin_profile("resnet18", 128), c, s, ips);
  std::printf("      %.1f GB/s; compute as a peak of %.0f GFLOP/s at efficiency %.2f\n",
              c.accelerator.memory_gbs, c.accelerator.f32_tflops * 1e3,
              c.accelerator.compute_efficiency);

  std::printf("[3/4] shared memory between 2 ranks: allreduce of 8 bytes and of 64 MiB\n");
  std::fflush(stdout);
  const std::string launch = "launch --nproc-per-node 2 -- '" + self() + "' bench comm ";
  const nlohmann::json small = run("bench comm 8 B",
                                   launch + "--min-bytes 8 --max-bytes 8 --iters 500 --json '" +
                                       (w.dir / "small.json").string() + "'",
                                   w.dir / "small.log", w.dir / "small.json");
  const nlohmann::json large = run("bench comm 64 MiB",
                                   launch + "--min-bytes 64M --max-bytes 64M --iters 5 --json '" +
                                       (w.dir / "large.json").string() + "'",
                                   w.dir / "large.log", w.dir / "large.json");
  // Two ranks: an allreduce is two steps of one message each, and moves the buffer once.
  c.intra.latency_us = small.at("rows").at(0).at("time_us").get<double>() / 2;
  c.intra.gbytes_per_s = large.at("rows").at(0).at("busbw").get<double>();
  c.intra.name = "shared memory (measured)";
  std::printf("      %.2f us per message, %.2f GB/s\n", c.intra.latency_us, c.intra.gbytes_per_s);

  std::printf("[4/4] decoding: 200 JPEGs of 500x375, random-resized-crop to 224, one worker\n");
  std::fflush(stdout);
  run("make-dataset",
      "make-dataset scans --out '" + (w.dir / "jpeg").string() +
          "' --count 200 --format jpeg --size 500 --height 375 --channels 3",
      w.dir / "make.log", {});
  const nlohmann::json d = run("bench data",
                               "bench data --source '" + (w.dir / "jpeg").string() +
                                   "' --batch 32 --workers 1 --size 224 --epochs 2 --json '" +
                                   (w.dir / "data.json").string() + "'",
                               w.dir / "data.log", w.dir / "data.json");
  c.decode_per_core = d.at("images_per_s").get<double>();
  std::printf("      %.0f images/s per core\n", c.decode_per_core);
  c.source =
      "measured by cohort plan --calibrate; the NIC is the preset's emulated 1 Gbit/s "
      "link (set nic_gbytes_per_s, or pass --nic-gbit)";
  return c;
}

}  // namespace cohort::cli
