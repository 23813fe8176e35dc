// Published scaling results the model is checked against (tests/plan, bench/validate-plan). Each
// input says where it comes from: the paper, a vendor datasheet, or an assumption of ours.
#include "cohort/plan/plan.h"

namespace cohort::plan {

namespace {

Cluster p100_cluster(const std::string& name, int per_node, const Link& intra, const Link& nic) {
  Cluster c;
  c.name = name;
  c.accelerators_per_node = per_node;
  // NVIDIA Tesla P100 datasheet: 10.6 TFLOP/s f32 (SXM2), 16 GB HBM2 at 732 GB/s; no bf16, so
  // the bf16 figure is the f32 one.
  c.accelerator = {"Tesla P100 16GB", 10.6, 10.6, 16, 732, 0.45, 0.6};
  c.intra = intra;
  c.nic = nic;
  c.nics_per_node = 1;
  c.cpu_cores = 40;
  c.decode_per_core = 500;
  c.reduce_gbytes_per_s = 300;
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
    g.cluster = p100_cluster("Big Basin (P100, 50 GbE)", 8, {"NVLink 1", 40, 3.4},
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
  return out;
}

double predicted_efficiency(const PublishedCase& c) {
  const Prediction at = predict(c.profile, c.cluster, c.strategy, c.nodes);
  if (c.base_nodes == 0) return at.efficiency;
  const Prediction base = predict(c.profile, c.cluster, c.strategy, c.base_nodes);
  return at.images_per_s / (base.images_per_s * c.nodes / c.base_nodes);
}

}  // namespace cohort::plan
