// cohort::plan: the built-in profiles against the models cohort::nn builds, the published
// scaling results, the qualitative claims (sublinear scaling, batch and accumulation raise
// efficiency up to where memory ends), memory by mode, bad inputs, and the CLI's outputs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cohort/core/error.h"
#include "cohort/nn/model.h"
#include "cohort/plan/plan.h"

namespace plan = cohort::plan;
namespace fs = std::filesystem;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("cohort-plan-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cohort::Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct CleanTemp : ::testing::Environment {
  void TearDown() override {
    fs::remove_all(fs::temp_directory_path() / ("cohort-plan-test-" + std::to_string(getpid())));
  }
};
const auto* kClean = ::testing::AddGlobalTestEnvironment(new CleanTemp);

}  // namespace

TEST(PlanProfile, ParametersAndUnitsMatchTheModelsNnBuilds) {
  for (const std::string& name : plan::builtin_models()) {
    cohort::nn::ModelOptions o;
    o.num_classes = 10;
    auto m = cohort::nn::make_model(name, o);
    const plan::ModelProfile p = plan::builtin_profile(name, 224, 3, 10);
    EXPECT_EQ(p.parameters(), m->num_parameters()) << name;
    std::vector<std::string> units;
    for (const auto& u : m->units()) units.push_back(u.name);
    EXPECT_EQ(p.units(), units) << name;
    // Parameters per unit, as zero3 shards and gathers them.
    for (const auto& u : m->units()) {
      int64_t want = 0, got = 0;
      for (int i = u.first; i < u.last; ++i) {
        int64_t n = 1;
        for (int64_t d : m->params()[static_cast<size_t>(i)]->shape) n *= d;
        want += n;
      }
      for (const auto& l : p.layers)
        if (l.unit == u.name) got += l.parameters;
      EXPECT_EQ(got, want) << name << " unit " << u.name;
    }
  }
}

TEST(PlanProfile, FlopsAgreeWithPublishedCounts) {
  // Multiply-adds at 224 px as commonly published (torchvision's model table): resnet18 1.81 G,
  // resnet50 4.09 G, densenet121 2.83 G; a multiply-add counts 2 here. Within 3%.
  EXPECT_NEAR(plan::builtin_profile("resnet18", 224).forward_flops() / 2e9, 1.81, 0.05);
  EXPECT_NEAR(plan::builtin_profile("resnet50", 224).forward_flops() / 2e9, 4.09, 0.12);
  EXPECT_NEAR(plan::builtin_profile("densenet121", 224).forward_flops() / 2e9, 2.83, 0.09);
  // FLOPs grow with the pixel count.
  const double f224 = plan::builtin_profile("resnet50", 224).forward_flops();
  const double f448 = plan::builtin_profile("resnet50", 448).forward_flops();
  EXPECT_NEAR(f448 / f224, 4.0, 0.05);
}

TEST(PlanProfile, FileRoundTripAndErrorsNameTheFileAndField) {
  const plan::ModelProfile p = plan::builtin_profile("resnet18", 128);
  const std::string path = write_temp("profile.json", "");
  plan::write_profile(p, path);
  const plan::ModelProfile q = plan::read_profile(path);
  EXPECT_EQ(q.parameters(), p.parameters());
  EXPECT_DOUBLE_EQ(q.forward_flops(), p.forward_flops());
  EXPECT_EQ(q.units(), p.units());

  const std::string bad = write_temp("bad.json", R"({"model": "x", "image": 64, "layers": [
      {"name": "a", "forward_flops": 1, "parameters": "many", "saved_elements": 1}]})");
  std::string e = error_of([&] { plan::read_profile(bad); });
  EXPECT_NE(e.find(bad), std::string::npos) << e;
  EXPECT_NE(e.find("layers[0]"), std::string::npos) << e;
  EXPECT_NE(e.find("parameters"), std::string::npos) << e;
  // A whole number written as 64.0 is read; a fraction, or one no int64 holds, is refused
  // naming the field (9.4e105 into int64 was undefined behaviour before: fuzz_files).
  const std::string whole = write_temp("whole.json", R"({"model": "x", "image": 64.0, "layers": [
      {"name": "a", "forward_flops": 1, "parameters": 1000.0, "saved_elements": 1}]})");
  EXPECT_EQ(plan::read_profile(whole).parameters(), 1000);
  for (const char* value : {"2.5", "9.4e105", "-1e19"}) {
    const std::string huge =
        write_temp("huge.json", std::string(R"({"model": "x", "image": 64, "layers": [
      {"name": "a", "forward_flops": 1, "parameters": )") +
                                    value + R"(, "saved_elements": 1}]})");
    e = error_of([&] { plan::read_profile(huge); });
    EXPECT_NE(e.find("'parameters': expected a whole number"), std::string::npos) << value << e;
  }
  const std::string junk = write_temp("junk.json", "{ not json");
  e = error_of([&] { plan::read_profile(junk); });
  EXPECT_NE(e.find(junk), std::string::npos) << e;
  e = error_of([&] { plan::builtin_profile("vgg16", 224); });
  EXPECT_NE(e.find("vgg16"), std::string::npos) << e;
  EXPECT_NE(e.find("resnet50"), std::string::npos) << e;
}

TEST(PlanCluster, FilesStartFromAPresetAndErrorsNameTheField) {
  const std::string toml = write_temp("c.toml",
                                      "base = \"dgx-a100\"\nnodes = 4\n"
                                      "nic_gbytes_per_s = 12.5\nnics_per_node = 1\n");
  const plan::Cluster c = plan::load_cluster(toml);
  EXPECT_EQ(c.nodes, 4);
  EXPECT_EQ(c.accelerators_per_node, 8);
  EXPECT_DOUBLE_EQ(c.nic.gbytes_per_s, 12.5);
  EXPECT_EQ(c.nics_per_node, 1);

  const std::string json = write_temp("c.json", "");
  plan::write_cluster(c, json);
  const plan::Cluster d = plan::load_cluster(json);
  EXPECT_EQ(d.nodes, 4);
  EXPECT_DOUBLE_EQ(d.accelerator.bf16_tflops, c.accelerator.bf16_tflops);

  const std::string unknown = write_temp("u.toml", "base = \"dgx-a100\"\nnic_gbit = 100\n");
  std::string e = error_of([&] { plan::load_cluster(unknown); });
  EXPECT_NE(e.find(unknown), std::string::npos) << e;
  EXPECT_NE(e.find("nic_gbit"), std::string::npos) << e;
  const std::string wrong = write_temp("w.json", R"({"base": "dgx-h100", "nodes": "four"})");
  e = error_of([&] { plan::load_cluster(wrong); });
  EXPECT_NE(e.find("'nodes'"), std::string::npos) << e;
  const std::string wraps = write_temp("x.json", R"({"base": "dgx-h100", "nodes": 4294967298})");
  e = error_of([&] { plan::load_cluster(wraps); });  // get<int>() would have read 2
  EXPECT_NE(e.find("'nodes': expected a whole number"), std::string::npos) << e;
  const std::string zero = write_temp("z.json", R"({"base": "dgx-h100", "memory_gib": 0})");
  e = error_of([&] { plan::load_cluster(zero); });
  EXPECT_NE(e.find("memory_gib"), std::string::npos) << e;
  const std::string negative =
      write_temp("n.toml", "base = \"cpu-host\"\nnic_cpu_ns_per_byte = -0.2\n");
  e = error_of([&] { plan::load_cluster(negative); });
  EXPECT_NE(e.find("nic_cpu_ns_per_byte -0.2"), std::string::npos) << e;
  const std::string broken = write_temp("b.toml", "nodes = = 3\n");
  e = error_of([&] { plan::load_cluster(broken); });
  EXPECT_NE(e.find(broken), std::string::npos) << e;
  EXPECT_NE(e.find("line 1"), std::string::npos) << e;
  e = error_of([&] { plan::load_cluster("dgx-z100"); });
  EXPECT_NE(e.find("dgx-z100"), std::string::npos) << e;
  EXPECT_NE(e.find("dgx-h100"), std::string::npos) << e;  // the presets are listed
}

TEST(PlanValidation, PublishedScalingResultsWithinTenPercent) {
  const auto cases = plan::published_cases();
  ASSERT_GE(cases.size(), 4u);  // Goyal et al., Horovod, PyTorch's DDP benchmark (2 models)
  for (const auto& c : cases) {
    const double predicted = plan::predicted_efficiency(c);
    std::printf("%-40s reported %.2f predicted %.3f\n", c.name.c_str(), c.reported_efficiency,
                predicted);
    EXPECT_NEAR(predicted / c.reported_efficiency, 1.0, 0.10) << c.name << ": " << c.claim;
    EXPECT_FALSE(c.inputs.empty()) << c.name;
    // The matched accelerator runs the paper's single-accelerator figure.
    EXPECT_GT(plan::alone_images_per_s(c.profile, c.cluster, c.strategy), 0);
  }
}

TEST(PlanModel, AMeasuredThroughputSetsTheComputePeakOrIsRefused) {
  const plan::ModelProfile p = plan::builtin_profile("resnet50", 224);
  const plan::Cluster c = plan::preset_cluster("dgx-a100");
  plan::Strategy s;
  const plan::Cluster m = plan::match_throughput(p, c, s, 1000);
  EXPECT_NEAR(plan::alone_images_per_s(p, m, s), 1000, 10);
  EXPECT_DOUBLE_EQ(m.accelerator.memory_gbs, c.accelerator.memory_gbs);
  EXPECT_LT(m.accelerator.bf16_tflops, c.accelerator.bf16_tflops);
  // Faster than the memory-bound layers allow: no peak gets there.
  const std::string e = error_of([&] { plan::match_throughput(p, c, s, 1e7); });
  EXPECT_NE(e.find("cannot be matched"), std::string::npos) << e;
}

TEST(PlanModel, ScalingIsSublinearAndBatchAndAccumulationRaiseEfficiency) {
  const plan::ModelProfile p = plan::builtin_profile("resnet50", 224);
  plan::Cluster c = plan::preset_cluster("a100-pcie-100gbe");
  plan::Strategy s;
  double last = 1.0;
  for (int nodes : {1, 2, 4, 8, 16, 32}) {
    const plan::Prediction r = plan::predict(p, c, s, nodes);
    EXPECT_LT(r.efficiency, 1.0) << nodes;
    EXPECT_LE(r.efficiency, last + 1e-12) << nodes;
    EXPECT_NEAR(r.step_ms,
                r.compute_ms + r.straggler_ms + r.comm_cpu_ms + r.exposed_comm_ms + r.data_wait_ms,
                1e-9);
    EXPECT_EQ(r.comm_cpu_ms, 0) << "a GPU preset's host cores do not run the model";
    last = r.efficiency;
  }
  // Per-accelerator batch, then accumulation, raise efficiency at 16 nodes; memory grows with
  // the batch until it no longer fits.
  double prev = 0;
  bool stopped_fitting = false;
  for (int batch = 8; batch <= 2048; batch *= 2) {
    s.batch = batch;
    const plan::Prediction r = plan::predict(p, c, s, 16);
    if (!r.memory.fits()) {
      stopped_fitting = true;
      break;
    }
    EXPECT_GT(r.efficiency, prev) << "batch " << batch;
    prev = r.efficiency;
  }
  EXPECT_TRUE(stopped_fitting) << "activations grow with the batch";
  s.batch = 32;
  prev = 0;
  for (int accum : {1, 2, 4, 8}) {
    s.accum = accum;
    const plan::Prediction r = plan::predict(p, c, s, 16);
    EXPECT_GT(r.efficiency, prev) << "accum " << accum;
    prev = r.efficiency;
  }
}

TEST(PlanModel, MemoryFallsWithEachShardingMode) {
  const plan::ModelProfile p = plan::builtin_profile("resnet152", 224);
  const plan::Cluster c = plan::preset_cluster("dgx-a100");
  plan::Strategy s;
  s.optimizer = "adamw";
  auto state = [&](plan::Mode m) {
    s.mode = m;
    const plan::Memory r = plan::predict(p, c, s, 4).memory;
    return r.parameters + r.gradients + r.optimizer;
  };
  const double ddp = state(plan::Mode::ddp), z1 = state(plan::Mode::zero1),
               z2 = state(plan::Mode::zero2), z3 = state(plan::Mode::zero3),
               hybrid = state(plan::Mode::hybrid);
  const double P = static_cast<double>(p.parameters());
  EXPECT_DOUBLE_EQ(ddp, 16 * P);  // f32 values and gradients, AdamW's two moments
  EXPECT_LT(z1, ddp);
  EXPECT_LT(z2, z1);
  EXPECT_LT(z3, z2);
  EXPECT_LT(z3, hybrid);  // hybrid shards over the node's 8, zero3 over all 32
  EXPECT_LT(hybrid, ddp);
}

TEST(PlanModel, OutOfMemoryIsSaidAndTheRecommendationFits) {
  // Full-resolution scans: resnet50 at 2048 px, batch 16 does not fit in 80 GB.
  const plan::ModelProfile p = plan::builtin_profile("resnet50", 2048, 1, 14);
  const plan::Cluster c = plan::preset_cluster("dgx-a100");
  plan::Strategy s;
  s.batch = 16;
  const plan::Prediction r = plan::predict(p, c, s, 2);
  EXPECT_FALSE(r.memory.fits());
  const plan::Recommendation rec = plan::recommend(p, c, s, 2, 0.9);
  EXPECT_TRUE(rec.prediction.memory.fits());
  EXPECT_LT(rec.strategy.batch, 16);
  EXPECT_FALSE(rec.reasons.empty());
}

TEST(PlanModel, SlowLinksMakeTheNetworkTheBottleneckAndDecodeNeedsCores) {
  const plan::ModelProfile p = plan::builtin_profile("resnet50", 224);
  plan::Cluster c = plan::preset_cluster("a100-pcie-100gbe");
  c.nic.gbytes_per_s = 1.25;  // 10 GbE
  plan::Strategy s;
  EXPECT_EQ(plan::predict(p, c, s, 8).bottleneck, "network");
  c = plan::preset_cluster("dgx-h100");
  c.cpu_cores = 16;  // too few cores to decode for 8 H100s
  const plan::Prediction r = plan::predict(p, c, s, 1);
  EXPECT_EQ(r.bottleneck, "input pipeline");
  EXPECT_GT(r.data_wait_ms, 0);
  EXPECT_GT(r.cores_per_accelerator_needed, 2);
  s.gpu_decode = true;
  EXPECT_EQ(plan::predict(p, c, s, 1).data_wait_ms, 0);
}

// Where the ranks' own cores move the bytes (CPU training over TCP or shared memory), the
// transfers' CPU time stretches the compute they overlap, and only that part: what runs while a
// rank waits costs it nothing.
TEST(PlanModel, CommunicationsCpuWorkSlowsTheComputeItOverlaps) {
  const plan::ModelProfile p = plan::builtin_profile("resnet18", 128);
  plan::Cluster c = plan::preset_cluster("cpu-host");
  c.accelerators_per_node = 1;
  c.nic.cpu_ns_per_byte = 0;
  c.intra.cpu_ns_per_byte = 0;
  plan::Strategy s;
  s.batch = 16;
  s.bf16 = false;
  s.mode = plan::Mode::zero1;
  c.nic.gbytes_per_s = 10;  // fast enough that every transfer overlaps compute
  const plan::Prediction free = plan::predict(p, c, s, 2);
  EXPECT_EQ(free.comm_cpu_ms, 0);
  c.nic.cpu_ns_per_byte = 0.5;
  const plan::Prediction paid = plan::predict(p, c, s, 2);
  // zero1 over 2 ranks: each reduce-scatters and gathers every gradient and parameter once,
  // sending half of each and receiving the other half: 2 x 4 bytes per parameter moved.
  const double all = 8.0 * static_cast<double>(p.parameters()) * 0.5 / 1e6;
  EXPECT_GT(paid.comm_cpu_ms, 0.9 * all);
  EXPECT_LE(paid.comm_cpu_ms, all * (1 + 1e-9));
  EXPECT_NEAR(paid.step_ms - free.step_ms, paid.comm_cpu_ms, 0.1 * paid.comm_cpu_ms);
  EXPECT_NEAR(paid.step_ms,
              paid.compute_ms + paid.straggler_ms + paid.comm_cpu_ms + paid.exposed_comm_ms +
                  paid.data_wait_ms,
              1e-9);
  // DDP over a slow link (100 Mbit/s): most of the allreduce runs after backward, while the
  // rank waits, so it costs compute little of its CPU time; the link's time is exposed instead.
  s.mode = plan::Mode::ddp;
  c.nic.gbytes_per_s = 0.0125;
  const plan::Prediction slow = plan::predict(p, c, s, 2);
  const double ddp_all = 2 * 4.0 * static_cast<double>(p.parameters()) * 0.5 / 1e6;
  EXPECT_LT(slow.comm_cpu_ms, 0.5 * ddp_all);
  EXPECT_GT(slow.exposed_comm_ms, slow.comm_cpu_ms);
  // The same prediction whatever the link's CPU cost, where the link is no CPU's.
  const plan::Cluster gpu = plan::preset_cluster("dgx-a100");
  EXPECT_EQ(plan::predict(p, gpu, s, 4).comm_cpu_ms, 0);
}

TEST(PlanCli, TableJsonAndPlots) {
  const char* bin = std::getenv("COHORT_BIN");
  ASSERT_NE(bin, nullptr);
  const fs::path dir = fs::path(write_temp("x", "")).parent_path();
  const std::string json = (dir / "plan.json").string(), svg = (dir / "svg").string();
  const std::string cmd = std::string(bin) +
                          " plan --model resnet50 --cluster dgx-h100 --nodes 1,2,4 --json " + json +
                          " --svg " + svg + " > " + (dir / "out.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j["rows"].size(), 3u);
  EXPECT_EQ(j["rows"][2]["nodes"], 4);
  EXPECT_GT(j["rows"][0]["images_per_s"].get<double>(), 0);
  EXPECT_TRUE(j["recommendation"].contains("reasons"));
  for (const char* name : {"efficiency.svg", "breakdown.svg"}) {
    std::ifstream s(fs::path(svg) / name);
    std::string text((std::istreambuf_iterator<char>(s)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.rfind("<svg", 0), 0u) << name;
    EXPECT_NE(text.find("</svg>"), std::string::npos) << name;
  }
  // A bad cluster file: one line naming it, exit 1.
  const std::string bad = write_temp("bad.toml", "base = \"dgx-a100\"\nnodes = \"x\"\n");
  const std::string cmd2 =
      std::string(bin) + " plan --cluster " + bad + " > " + (dir / "err.txt").string() + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd2.c_str())), 1);
  std::ifstream e(dir / "err.txt");
  std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  EXPECT_NE(err.find(bad), std::string::npos) << err;
  EXPECT_NE(err.find("nodes"), std::string::npos) << err;
}

TEST(PlanCli, BenchTrainWritesAMeasuredProfileThatPlanReads) {
  const char* bin = std::getenv("COHORT_BIN");
  ASSERT_NE(bin, nullptr);
  const fs::path dir = fs::path(write_temp("y", "")).parent_path();
  // ResNet's basic and bottleneck blocks and DenseNet's concatenations each map op to layer.
  for (const std::string model : {"resnet18", "resnet50", "densenet121"}) {
    const std::string path = (dir / (model + ".json")).string();
    const std::string cmd = std::string(bin) + " bench train --model " + model +
                            " --batch 2 --image-size 64 --steps 2 --warmup 1 --threads 1 "
                            "--no-profile --profile " +
                            path + " > " + (dir / "bt.txt").string() + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const plan::ModelProfile p = plan::read_profile(path);
    EXPECT_EQ(p.parameters(), plan::builtin_profile(model, 64).parameters()) << model;
    double total = 0;
    for (const plan::Layer& l : p.layers) {
      EXPECT_GE(l.measured_ms, 0) << model << " " << l.name;
      if (l.kind == plan::LayerKind::conv) {
        EXPECT_GT(l.measured_ms, 0) << model << " " << l.name;
      }
      total += l.measured_ms;
    }
    EXPECT_GT(total, 0) << model;
    // cohort plan runs the layers at their measured times (the optimizer's pass over memory
    // made free here, as the profile does not time it).
    plan::Strategy s;
    s.batch = 2;
    s.bf16 = false;
    plan::Cluster c = plan::preset_cluster("cpu-host");
    c.accelerator.memory_gbs = 1e9;
    EXPECT_NEAR(plan::alone_images_per_s(p, c, s), 1e3 / total, 1e3 / total * 1e-6) << model;
  }
  const std::string bad = (dir / "small.json").string();
  const std::string cmd = std::string(bin) +
                          " bench train --model smallcnn --steps 1 --warmup 0 --profile " + bad +
                          " > " + (dir / "bt.txt").string() + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 1) << "no built-in profile for smallcnn";
}

TEST(PlanCli, CalibrateWritesAClusterOfThisMachine) {
  const char* bin = std::getenv("COHORT_BIN");
  ASSERT_NE(bin, nullptr);
  const fs::path dir = fs::path(write_temp("z", "")).parent_path();
  const std::string path = (dir / "this.json").string();
  const std::string cmd =
      std::string(bin) + " plan --calibrate " + path + " > " + (dir / "cal.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const plan::Cluster c = plan::load_cluster(path);  // passes the file checks
  EXPECT_EQ(c.accelerators_per_node, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_GT(c.accelerator.f32_tflops, 0.001);  // at least a GFLOP/s per core
  EXPECT_GT(c.intra.gbytes_per_s, 0.1);
  EXPECT_GT(c.intra.latency_us, 0);
  EXPECT_GT(c.decode_per_core, 10);
  // Moving a byte costs some CPU time, and less than a microsecond.
  EXPECT_GT(c.intra.cpu_ns_per_byte, 0);
  EXPECT_GT(c.nic.cpu_ns_per_byte, 0.001);
  EXPECT_LT(c.nic.cpu_ns_per_byte, 1000);
  // The calibrated cluster predicts resnet18 at about the rate it measured.
  plan::Strategy s;
  s.batch = 16;
  s.bf16 = false;
  const double ips = plan::alone_images_per_s(plan::builtin_profile("resnet18", 128), c, s);
  std::ifstream out(dir / "cal.txt");
  std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  const size_t at = text.find(" images/s, step time spread");
  ASSERT_NE(at, std::string::npos) << text;
  const double measured = std::stod(text.substr(text.rfind(' ', at - 1) + 1));
  EXPECT_NEAR(ips / measured, 1.0, 0.02) << text;
}
