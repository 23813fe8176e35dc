// `cohort plan --calibrate FILE`: measures this machine and writes a cluster file for it. Each
// measurement runs this same binary (`cohort bench train`, `cohort bench comm` under `cohort
// launch`, `make-dataset` and `bench data`) with its output in a log, and reads its JSON.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
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

// CPU seconds (user and system, all threads) this process has used.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU time per byte sent or received over TCP on loopback, in ns: a thread sends 512 MiB to
// another through the kernel's TCP stack, and the process's CPU time (both threads, the kernel's
// work on their behalf included) is divided by the bytes sent and received. A rank whose
// collectives cross hosts over TCP pays about this per byte on its own cores.
double tcp_cpu_ns_per_byte() {
  auto fail = [](const char* what) {
    COHORT_THROW("calibration step 'TCP on loopback': " << what << ": " << std::strerror(errno));
  };
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) fail("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(listener);
    fail("bind on 127.0.0.1");
  }
  const int out = socket(AF_INET, SOCK_STREAM, 0);
  if (out < 0 || connect(out, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(listener);
    if (out >= 0) close(out);
    fail("connect to 127.0.0.1");
  }
  const int in = accept(listener, nullptr, nullptr);
  close(listener);
  if (in < 0) {
    close(out);
    fail("accept");
  }
  const size_t chunk = size_t{1} << 20, total = size_t{512} << 20;
  const double cpu0 = cpu_seconds();
  std::thread sender([&] {
    std::vector<char> buf(chunk, 1);
    for (size_t sent = 0; sent < total;) {
      const ssize_t n = send(out, buf.data(), std::min(chunk, total - sent), MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    shutdown(out, SHUT_WR);  // a sender that stopped early ends the receiver's loop too
  });
  std::vector<char> buf(chunk);
  size_t got = 0;
  while (got < total) {
    const ssize_t n = recv(in, buf.data(), chunk, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  sender.join();
  const double cpu = cpu_seconds() - cpu0;
  close(in);
  close(out);
  COHORT_CHECK(got == total, "calibration step 'TCP on loopback': received " << got << " of "
                                                                             << total << " bytes");
  return cpu * 1e9 / (2.0 * static_cast<double>(total));
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

  std::printf("[1/5] compute: resnet18, 16 images of 128 px per step, one thread, 12 steps\n");
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
  std::printf("[2/5] memory bandwidth of one core\n");
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

  std::printf("[3/5] shared memory between 2 ranks: allreduce of 8 bytes and of 64 MiB\n");
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
  // The shared-memory transport copies each byte a rank sends into a ring and each byte it
  // receives out of one: a copy reads and writes the byte (copy_gbytes_per_s counts both).
  c.intra.cpu_ns_per_byte = 2 / c.accelerator.memory_gbs;
  std::printf("      %.2f us per message, %.2f GB/s\n", c.intra.latency_us, c.intra.gbytes_per_s);

  std::printf("[4/5] TCP on loopback: CPU time per byte sent or received\n");
  std::fflush(stdout);
  c.nic.cpu_ns_per_byte = tcp_cpu_ns_per_byte();
  std::printf("      %.3f ns per byte\n", c.nic.cpu_ns_per_byte);

  std::printf("[5/5] decoding: 200 JPEGs of 500x375, random-resized-crop to 224, one worker\n");
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
