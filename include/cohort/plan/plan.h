// cohort::plan: predicts a training run's step time, memory, input-pipeline needs and scaling on
// a cluster before anyone books it. Inputs: a model profile (per layer FLOPs, parameters and
// saved activations), a cluster (accelerators, links, NICs, CPU cores) and a strategy (mode,
// buckets, batch, accumulation, precision, decode). Depends on core only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::plan {

// ---------------------------------------------------------------------------------------------
// Model profiles

enum class LayerKind { conv, linear, norm, pool, add, other };
const char* layer_kind_name(LayerKind k);

struct Layer {
  std::string name;  // torchvision's module name: "layer1.0.conv1"
  std::string unit;  // the sharding and staging unit it belongs to: "stem", "layer1.0", "head"
  LayerKind kind = LayerKind::other;
  double forward_flops = 0;  // per image (a multiply-add counts 2)
  int64_t parameters = 0;
  double saved_elements = 0;  // per image: activation elements kept for backward
  double moved_elements = 0;  // per image: elements read and written by the forward
  double measured_ms = -1;    // per image, forward + backward, where a profile measured it
};

struct ModelProfile {
  std::string model;
  int image = 224;
  int in_channels = 3;
  int classes = 1000;
  std::vector<Layer> layers;
  std::string source = "computed from the model definition";

  int64_t parameters() const;
  double forward_flops() const;            // per image
  std::vector<std::string> units() const;  // in forward order
};

// resnet18/34/50/101/152 and densenet121 (torchvision's layouts, as cohort::nn builds them) at
// any image size; the unit names are those of `cohort train --shard zero3`.
ModelProfile builtin_profile(const std::string& model, int image, int in_channels = 3,
                             int classes = 1000);
std::vector<std::string> builtin_models();

// Measured times per recorded op, in forward order (`cohort bench train --profile`: the tape's
// timeline): kind "conv.fwd", "bn.fwd", "add.fwd", "pool.fwd", "avgpool.fwd", "linear.fwd",
// "concat.fwd", ...; seconds summed over `steps` steps of `batch` images.
struct MeasuredOp {
  std::string kind;
  double forward_s = 0, backward_s = 0;
};
// Sets each layer's measured_ms from the ops, matched in order by kind (ops of no layer, such as
// flatten and the loss, are skipped). Throws naming the layer where the ops stop matching.
void attach_measurements(ModelProfile& p, const std::vector<MeasuredOp>& ops, int steps, int batch);

// JSON, as `cohort bench train --profile FILE` writes it; errors name the file and the field.
ModelProfile read_profile(const std::string& path);
void write_profile(const ModelProfile& p, const std::string& path);

// ---------------------------------------------------------------------------------------------
// Clusters

struct Accelerator {
  std::string name;
  double bf16_tflops = 0;  // dense peak
  double f32_tflops = 0;
  double memory_gib = 0;
  double memory_gbs = 0;  // memory bandwidth, GB/s
  // Fraction of peak that convolutions and matrix products reach in training; memory-bound
  // layers (norms, pools, adds) run at `memory_gbs` times `memory_efficiency`.
  double compute_efficiency = 0.45;
  double memory_efficiency = 0.6;
};

struct Link {
  std::string name;
  double gbytes_per_s = 0;  // per direction
  double latency_us = 0;    // per message
  // CPU time the ranks' own cores spend per byte a rank sends or receives over this link: the
  // copies of a shared-memory transport, a TCP stack. While compute runs, it is taken from
  // compute. 0 where the link moves data with engines of its own (NVLink, RDMA NICs, and the
  // GPU presets, whose host cores do not run the model).
  double cpu_ns_per_byte = 0;
};

struct Cluster {
  std::string name;
  std::string source;  // where the figures come from
  int nodes = 1;
  int accelerators_per_node = 1;
  Accelerator accelerator;
  Link intra;  // between the accelerators of a node, per accelerator
  Link nic;    // one NIC
  int nics_per_node = 1;
  int cpu_cores = 1;                 // per node
  double decode_per_core = 0;        // images/s one core decodes and augments (224 px from JPEG)
  double gpu_decode_per_accel = 0;   // images/s an accelerator decodes itself; 0: none
  double reduce_gbytes_per_s = 100;  // the reduction kernel
  // Overheads per step that no layer accounts for (framework, launch, optimizer bookkeeping),
  // in ms: measured by --calibrate on this machine, 0 elsewhere.
  double step_overhead_ms = 0;
  // Spread of one rank's compute time from step to step (standard deviation over mean). A
  // synchronous step waits for the slowest of W ranks, about jitter * sqrt(2 ln W) of compute
  // later than the mean (the expected maximum of W normal draws). 0.02 by default, an
  // assumption for GPUs; --calibrate measures it here.
  double step_jitter = 0.02;
};

std::vector<std::string> cluster_presets();
Cluster preset_cluster(const std::string& name);
// A preset name, or a TOML or JSON file (every field of Cluster; a preset to start from with
// `base`). Errors name the file and the field.
Cluster load_cluster(const std::string& name_or_path);
void write_cluster(const Cluster& c, const std::string& path);

// ---------------------------------------------------------------------------------------------
// Strategies and predictions

enum class Mode { ddp, zero1, zero2, zero3, hybrid };
const char* mode_name(Mode m);
Mode parse_mode(const std::string& s);

struct Strategy {
  Mode mode = Mode::ddp;
  double bucket_mb = 25;
  int batch = 32;  // per accelerator, per micro-batch
  int accum = 1;   // micro-batches per step
  bool bf16 = true;
  bool reduce_bf16 = false;       // gradients reduced in bf16
  std::string optimizer = "sgd";  // sgd (momentum), adamw, lars
  bool gpu_decode = false;
  bool reshard_after_forward = true;  // zero3
  // Accumulation in sharded modes: false reduce-scatters every micro-batch (no full gradient
  // kept), true keeps local full gradients and communicates once.
  bool accum_local = false;
};

// Bytes per GiB, the unit accelerator memory is given and reported in.
inline constexpr double kGiB = 1024.0 * 1024 * 1024;

// Latencies per message from NCCL's tuning tables (src/graph/tuning.cc, ring, Simple protocol):
// 3.4 us per step over NVLink, 14 us over the network, 1.0-4 us over PCIe. The presets and the
// published cases take them.
inline constexpr double kNvlinkLatencyUs = 3.4;
inline constexpr double kNetLatencyUs = 14.0;
inline constexpr double kPcieLatencyUs = 4.0;

struct Memory {
  double parameters = 0, gradients = 0, optimizer = 0, gathered = 0, activations = 0, buffers = 0;
  double total() const;
  double capacity = 0;  // usable bytes of the accelerator
  bool fits() const { return total() <= capacity; }
};

struct Prediction {
  int nodes = 1;
  int world = 1;
  int global_batch = 0;
  double compute_ms = 0;        // forward + backward + update, all micro-batches
  double communication_ms = 0;  // time the link is busy
  double exposed_comm_ms = 0;   // what compute does not hide
  // Compute slowed by communication's own CPU work (Link::cpu_ns_per_byte) while they overlap.
  double comm_cpu_ms = 0;
  double straggler_ms = 0;  // waiting for the slowest rank (step_jitter)
  double data_wait_ms = 0;  // what the input pipeline adds
  double step_ms = 0;
  double images_per_s = 0;
  double efficiency = 1;               // images/s over world times one accelerator's, alone
  double images_needed_per_node = 0;   // per second, to keep the accelerators busy
  double images_decoded_per_node = 0;  // per second, what the node's decode gives
  double cores_per_accelerator_needed = 0;
  std::string bottleneck;  // "compute", "network" or "input pipeline"
  Memory memory;
};

Prediction predict(const ModelProfile& p, const Cluster& c, const Strategy& s, int nodes);

// The modes whose memory fits at this batch, in the order ddp, zero1, zero2, hybrid, zero3.
// The cluster with its accelerator's compute peak scaled so that one accelerator alone runs this
// model and strategy at `images_per_s` (memory figures kept): how a measured or published
// single-accelerator throughput becomes the model's input. Throws where the memory-bound part
// alone is slower than that.
Cluster match_throughput(const ModelProfile& p, Cluster c, const Strategy& s, double images_per_s);
double alone_images_per_s(const ModelProfile& p, const Cluster& c, const Strategy& s);

std::vector<Mode> modes_that_fit(const ModelProfile& p, const Cluster& c, const Strategy& s,
                                 int nodes);

struct Recommendation {
  Strategy strategy;
  Prediction prediction;
  bool reached = false;              // the target efficiency is met
  std::vector<std::string> reasons;  // one sentence per choice
};

// The smallest global batch, then the least memory, that reaches `target` efficiency at `nodes`
// among modes that fit, buckets of 5-100 MB, batches up to what fits and accumulation up to 16.
Recommendation recommend(const ModelProfile& p, const Cluster& c, const Strategy& base, int nodes,
                         double target);

// ---------------------------------------------------------------------------------------------
// Validation against published scaling results: each paper's cluster, model, batch and
// single-accelerator throughput as inputs (sources in `inputs`), and the efficiency it reports
// at `nodes` relative to `base_nodes`.

struct PublishedCase {
  std::string name;                 // "Goyal et al. 2017"
  std::string claim;                // what the paper reports, in its words' sense
  std::vector<std::string> inputs;  // each input and where it comes from
  ModelProfile profile;
  Cluster cluster;  // already matched to the single-accelerator throughput
  Strategy strategy;
  int base_nodes = 1;  // efficiency relative to this many nodes (0: one accelerator)
  int nodes = 1;
  double reported_efficiency = 0;
};
std::vector<PublishedCase> published_cases();
// The predicted efficiency in the paper's terms: images/s at `nodes` over nodes/base_nodes times
// images/s at `base_nodes` (or over world times one accelerator alone).
double predicted_efficiency(const PublishedCase& c);

// ---------------------------------------------------------------------------------------------
// Plots: SVG files a browser shows.

std::string efficiency_svg(const std::vector<Prediction>& rows, const std::string& title);
std::string breakdown_svg(const std::vector<Prediction>& rows, const std::string& title);

}  // namespace cohort::plan
