// Published scaling results the model is checked against (tests/plan, bench/validate-plan). Each
// input says where it comes from: the paper, a vendor datasheet, or an assumption of ours.
#include <cstdio>

#include "cohort/plan/plan.h"

namespace cohort::plan {

namespace {

Cluster gpu_cluster(const std::string& name, const Accelerator& a, int per_node, const Link& intra,
                    const Link& nic, int nics) {
  Cluster c;
  c.name = name;
  c.accelerators_per_node = per_node;
  c.accelerator = a;
  c.intra = intra;
  c.nic = nic;
  c.nics_per_node = nics;
  c.cpu_cores = 40;
  c.decode_per_core = 500;
  c.reduce_gbytes_per_s = 300;
  return c;
}

Cluster p100_cluster(const std::string& name, int per_node, const Link& intra, const Link& nic) {
  // NVIDIA Tesla P100 datasheet: 10.6 TFLOP/s f32 (SXM2), 16 GB HBM2 at 732 GB/s; no bf16, so
  // the bf16 figure is the f32 one.
  return gpu_cluster(name, {"Tesla P100 16GB", 10.6, 10.6, 16, 732, 0.45, 0.6}, per_node, intra,
                     nic, 1);
}

// PyTorch's DDP benchmark (benchmarks/distributed/ddp in PyTorch's repository, by PyTorch's
// distributed team): torchvision's model at 224 px, 32 images per GPU, f32, SGD with momentum,
// DDP over NCCL with 25 MB buckets, on DGX-1 servers of 8 V100; its README's table.
PublishedCase pytorch_ddp_benchmark(const std::string& model, const std::string& shown,
                                    double alone, double at16) {
  PublishedCase c;
  c.name = "PyTorch's DDP benchmark, " + shown;
  char claim[160];
  std::snprintf(claim, sizeof claim, "%s, %.1f%% on 16 GPUs (2 DGX-1) against one without DDP",
                shown.c_str(), 100 * at16 / alone);
  c.claim = claim;
  char latencies[128];
  std::snprintf(latencies, sizeof latencies,
                "latencies from NCCL's tuning tables, %.1f us over NVLink and %.0f us over the "
                "network (ours); step jitter 2%% (ours)",
                kNvlinkLatencyUs, kNetLatencyUs);
  c.inputs = {
      model +
          " from torchvision at 224 px, 32 images per GPU, f32, SGD with momentum, DDP "
          "over NCCL with 25 MB buckets, broadcast_buffers off (the benchmark's script)",
      "DGX-1 servers: 8 Tesla V100 in NVLink's hybrid cube mesh, 4x 100 Gbit/s InfiniBand each "
      "(the README's topology and text)",
      "one GPU without DDP runs " + std::to_string(static_cast<int>(alone)) +
          " images/s; 16 GPUs (2 servers) " + std::to_string(static_cast<int>(at16)) +
          " images/s per GPU, medians (benchmarks/distributed/ddp/README.md, PyTorch 1.4, "
          "CUDA 10)",
      "V100 SXM2 figures from NVIDIA's datasheet (15.7 TFLOP/s f32, 900 GB/s); NVLink 2 at "
      "75 GB/s per GPU per direction (ours: 6 links of 25 GB/s shared by two rings)",
      latencies,
      "the reported efficiency is 16 GPUs against 16 times one GPU without DDP"};
  c.profile = builtin_profile(model, 224);
  c.strategy.batch = 32;
  c.strategy.bf16 = false;
  c.strategy.bucket_mb = 25;
  c.cluster = gpu_cluster(
      "DGX-1 (V100, 4x EDR InfiniBand)", {"Tesla V100 SXM2 16GB", 15.7, 15.7, 16, 900, 0.45, 0.6},
      8, {"NVLink 2", 75, kNvlinkLatencyUs}, {"InfiniBand EDR 100 Gbit/s", 12.5, kNetLatencyUs}, 4);
  c.cluster.nodes = 2;
  c.cluster = match_throughput(c.profile, c.cluster, c.strategy, alone);
  c.base_nodes = 0;
  c.nodes = 2;
  c.reported_efficiency = at16 / alone;
  return c;
}

}  // namespace

std::vector<PublishedCase> published_cases() {
  std::vector<PublishedCase> out;
  {
    PublishedCase g;
    g.name = "Goyal et al. 2017";
    g.claim = "ResNet-50, ~90% scaling efficiency from 8 to 256 GPUs (abstract)";
    g.inputs = {
        "ResNet-50 at 224 px, 32 images per GPU, f32, SGD with momentum (paper)",
        "Big Basin servers: 8 Tesla P100 joined by NVLink, one 50 Gbit/s Ethernet NIC "
        "(ConnectX-4) each (paper)",
        "backward of 32 images on one P100 takes 120 ms (paper); forward taken as "
        "half of that (ours), so one GPU runs 32 images in 180 ms: 178 images/s",
        "P100 figures from NVIDIA's datasheet; NVLink at 40 GB/s per GPU per direction in the "
        "hybrid cube-mesh (ours, from 4 links of 20 GB/s shared by two rings)",
        "Ethernet latency 25 us per message (ours, TCP); step jitter 2% (ours)",
        "the reported efficiency is 256 GPUs against 32 times one 8-GPU server"};
    g.profile = builtin_profile("resnet50", 224);
    g.strategy.batch = 32;
    g.strategy.bf16 = false;
    g.strategy.bucket_mb = 25;
    g.cluster = p100_cluster("Big Basin (P100, 50 GbE)", 8, {"NVLink 1", 40, kNvlinkLatencyUs},
                             {"50 Gbit/s Ethernet", 6.25, 25});
    g.cluster.nodes = 32;
    g.cluster = match_throughput(g.profile, g.cluster, g.strategy, 32 / 0.180);
    g.base_nodes = 1;
    g.nodes = 32;
    g.reported_efficiency = 0.90;
    out.push_back(g);
  }
  {
    PublishedCase h;
    h.name = "Sergeev and Del Balso 2018 (Horovod)";
    h.claim = "ResNet-101, 88% scaling efficiency on 128 GPUs over 25 Gbit/s TCP";
    h.inputs = {
        "ResNet-101 at 224 px, f32, TensorFlow's benchmark scripts with Horovod (paper)",
        "servers of 4 Pascal GPUs on a 25 Gbit/s network, TCP (paper)",
        "64 images per GPU, the benchmark scripts' default for ResNet-101 (ours)",
        "one P100 runs ResNet-101 at about 130 images/s in TensorFlow of the time (ours: the "
        "paper plots images/s against GPUs without stating the single-GPU figure)",
        "PCIe 3.0 x16 inside a server, 10 GB/s per direction (ours); TCP latency 25 us (ours); "
        "step jitter 2% (ours)",
        "the reported efficiency is 128 GPUs against 128 times one GPU"};
    h.profile = builtin_profile("resnet101", 224);
    h.strategy.batch = 64;
    h.strategy.bf16 = false;
    h.strategy.bucket_mb = 64;  // Horovod's fusion buffer
    h.cluster = p100_cluster("Horovod's cluster (P100, 25 GbE)", 4, {"PCIe 3.0 x16", 10, 4},
                             {"25 Gbit/s Ethernet, TCP", 3.125, 25});
    h.cluster.nodes = 32;
    h.cluster = match_throughput(h.profile, h.cluster, h.strategy, 130);
    h.base_nodes = 0;
    h.nodes = 32;
    h.reported_efficiency = 0.88;
    out.push_back(h);
  }
  out.push_back(pytorch_ddp_benchmark("resnet50", "ResNet-50", 329, 306));
  out.push_back(pytorch_ddp_benchmark("resnet101", "ResNet-101", 197, 178));
  return out;
}

double predicted_efficiency(const PublishedCase& c) {
  const Prediction at = predict(c.profile, c.cluster, c.strategy, c.nodes);
  if (c.base_nodes == 0) return at.efficiency;
  const Prediction base = predict(c.profile, c.cluster, c.strategy, c.base_nodes);
  return at.images_per_s / (base.images_per_s * c.nodes / c.base_nodes);
}

}  // namespace cohort::plan
