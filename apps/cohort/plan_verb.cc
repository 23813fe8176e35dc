// `cohort plan`: predicted step time, memory, input needs and scaling for a model on a cluster,
// a recommendation, SVG plots and JSON (cohort::plan); `--write-profile` writes the model's
// profile.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/plan/plan.h"
#include "plan_calibrate.h"
#include "verbs.h"

namespace cohort::cli {

namespace {

namespace plan = cohort::plan;
constexpr double kGiB = 1024.0 * 1024 * 1024;

std::vector<int> parse_nodes(const std::string& text, int cluster_nodes) {
  std::vector<int> out;
  if (text.empty()) {  // 1, 2, 4 ... the cluster's nodes; 32 for a cluster of one node
    const int last = cluster_nodes > 1 ? cluster_nodes : 32;
    for (int n = 1; n <= last; n *= 2) out.push_back(n);
    if (out.back() != last) out.push_back(last);
    return out;
  }
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    int n = 0;
    try {
      size_t used = 0;
      n = std::stoi(item, &used);
      COHORT_CHECK(used == item.size(), "");
    } catch (const std::exception&) {
      COHORT_THROW("--nodes '" << text << "': '" << item << "' is not a whole number");
    }
    COHORT_CHECK(n >= 1 && n <= 100000, "--nodes: " << n << " is outside 1..100000");
    out.push_back(n);
  }
  COHORT_CHECK(!out.empty(), "--nodes '" << text << "': no node counts");
  return out;
}

nlohmann::json memory_json(const plan::Memory& m) {
  return {{"parameters", m.parameters}, {"gradients", m.gradients},     {"optimizer", m.optimizer},
          {"gathered", m.gathered},     {"activations", m.activations}, {"buffers", m.buffers},
          {"total", m.total()},         {"capacity", m.capacity},       {"fits", m.fits()}};
}

nlohmann::json row_json(const plan::Prediction& r) {
  return {{"nodes", r.nodes},
          {"world", r.world},
          {"global_batch", r.global_batch},
          {"step_ms", r.step_ms},
          {"compute_ms", r.compute_ms},
          {"communication_ms", r.communication_ms},
          {"exposed_comm_ms", r.exposed_comm_ms},
          {"comm_cpu_ms", r.comm_cpu_ms},
          {"straggler_ms", r.straggler_ms},
          {"data_wait_ms", r.data_wait_ms},
          {"images_per_s", r.images_per_s},
          {"efficiency", r.efficiency},
          {"images_needed_per_node", r.images_needed_per_node},
          {"images_decoded_per_node", r.images_decoded_per_node},
          {"cores_per_accelerator_needed", r.cores_per_accelerator_needed},
          {"bottleneck", r.bottleneck},
          {"memory", memory_json(r.memory)}};
}

nlohmann::json strategy_json(const plan::Strategy& s) {
  return {{"mode", plan::mode_name(s.mode)},
          {"bucket_mb", s.bucket_mb},
          {"batch", s.batch},
          {"accum", s.accum},
          {"precision", s.bf16 ? "bf16" : "f32"},
          {"reduce_dtype", s.reduce_bf16 ? "bf16" : "f32"},
          {"optimizer", s.optimizer},
          {"decode", s.gpu_decode ? "gpu" : "cpu"},
          {"reshard_after_forward", s.reshard_after_forward},
          {"accum_local", s.accum_local}};
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  COHORT_CHECK(f, path << ": cannot write");
  f << text;
  COHORT_CHECK(f.good(), path << ": write failed (disk full?)");
}

}  // namespace

Run add_plan(CLI::App& app) {
  struct Opts {
    std::string model = "resnet50", profile, cluster = "dgx-a100", nodes, mode = "ddp";
    std::string precision = "bf16", reduce_dtype = "f32", optimizer = "sgd", decode = "cpu";
    std::string json, svg, write_profile, calibrate;
    double alone = 0;
    bool published = false;
    int image = 224, in_channels = 3, classes = 1000, batch = 32, accum = 1;
    double bucket_mb = 25, target = 0.9, nic_gbit = 0, decode_per_core = 0;
    bool reshard_after_forward = true, accum_local = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "A built-in profile: resnet18/34/50/101/152, densenet121");
  app.add_option("--profile", o->profile, "A profile file (JSON) instead of a built-in one");
  app.add_option("--image", o->image, "Image side in pixels")->check(CLI::Range(32, 16384));
  app.add_option("--in-channels", o->in_channels, "Input channels (1 for greyscale scans)")
      ->check(CLI::Range(1, 64));
  app.add_option("--classes", o->classes, "Outputs of the head")->check(CLI::Range(1, 1000000));
  app.add_option("--cluster", o->cluster,
                 "A preset (dgx-h100, dgx-a100, a100-pcie-100gbe, cpu-host) or a TOML/JSON file");
  app.add_option("--nodes", o->nodes,
                 "Node counts, e.g. 1,2,4,8 (default: 1, 2, 4 ... the cluster file's nodes, "
                 "or 32)");
  app.add_option("--nic-gbit", o->nic_gbit, "Override the NIC rate, Gbit/s per NIC")
      ->check(CLI::Range(0.001, 100000.0));
  app.add_option("--decode-per-core", o->decode_per_core,
                 "Override images/s one core decodes (e.g. measured by cohort bench data)")
      ->check(CLI::Range(0.001, 1e9));
  app.add_option("--mode", o->mode, "ddp, zero1, zero2, zero3, hybrid")
      ->check(CLI::IsMember({"ddp", "none", "zero1", "zero2", "zero3", "hybrid"}));
  app.add_option("--bucket-mb", o->bucket_mb, "DDP bucket size, MB")->check(CLI::Range(0.01, 1e5));
  app.add_option("--batch", o->batch, "Images per accelerator per micro-batch")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--accum-steps", o->accum, "Micro-batches per step")->check(CLI::Range(1, 4096));
  app.add_option("--precision", o->precision, "bf16 or f32")->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--reduce-dtype", o->reduce_dtype, "Gradients on the wire: f32 or bf16")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--optimizer", o->optimizer, "sgd, adamw, lars")
      ->check(CLI::IsMember({"sgd", "adamw", "lars"}));
  app.add_option("--decode", o->decode, "cpu, or gpu where the cluster decodes on accelerators")
      ->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_option("--reshard-after-forward", o->reshard_after_forward,
                 "zero3: free gathered units after forward (true) or keep them for backward");
  app.add_flag("--accum-local", o->accum_local,
               "Sharded modes: keep full local gradients over micro-batches, reduce once");
  app.add_option("--target", o->target, "Scaling efficiency the recommendation aims for")
      ->check(CLI::Range(0.01, 1.0));
  app.add_option("--json", o->json, "Write everything as JSON to this file");
  app.add_option("--svg", o->svg, "Write efficiency.svg and breakdown.svg into this folder");
  app.add_option("--write-profile", o->write_profile, "Write the model's profile (JSON) here");
  app.add_option("--calibrate", o->calibrate,
                 "Measure this machine (compute, memory, shared memory, decoding) and write a "
                 "cluster file for it here; then exit");
  app.add_flag("--published", o->published,
               "Print the published scaling results the model is validated against, each with "
               "its inputs and sources, the reported and the predicted efficiency; then exit");
  app.add_option("--alone-images-per-s", o->alone,
                 "One accelerator's measured images/s for this model and strategy: scales the "
                 "accelerator's efficiency to match it")
      ->check(CLI::Range(1e-6, 1e12));

  return [o]() -> int {
    if (o->published) {
      nlohmann::json cases = nlohmann::json::array();
      std::printf("%-40s %-62s %9s %9s %7s\n", "paper", "claim", "reported", "predicted", "ratio");
      for (const plan::PublishedCase& pc : plan::published_cases()) {
        const double e = plan::predicted_efficiency(pc);
        std::printf("%-40s %-62s %8.1f%% %8.1f%% %7.3f\n", pc.name.c_str(), pc.claim.c_str(),
                    100 * pc.reported_efficiency, 100 * e, e / pc.reported_efficiency);
        for (const std::string& in : pc.inputs) std::printf("    input: %s\n", in.c_str());
        cases.push_back({{"paper", pc.name},
                         {"claim", pc.claim},
                         {"inputs", pc.inputs},
                         {"reported_efficiency", pc.reported_efficiency},
                         {"predicted_efficiency", e}});
      }
      if (!o->json.empty())
        write_file(o->json, nlohmann::json{{"published", cases}}.dump(1) + "\n");
      return 0;
    }
    if (!o->calibrate.empty()) {
      plan::write_cluster(calibrate_this_machine(), o->calibrate);
      std::printf("wrote %s\n", o->calibrate.c_str());
      return 0;
    }
    const plan::ModelProfile p =
        o->profile.empty() ? plan::builtin_profile(o->model, o->image, o->in_channels, o->classes)
                           : plan::read_profile(o->profile);
    if (!o->write_profile.empty()) plan::write_profile(p, o->write_profile);
    plan::Cluster c = plan::load_cluster(o->cluster);
    if (o->nic_gbit > 0) {
      c.nic.gbytes_per_s = o->nic_gbit / 8;
      c.nic.name += " (set to " + std::to_string(o->nic_gbit) + " Gbit/s)";
    }
    if (o->decode_per_core > 0) c.decode_per_core = o->decode_per_core;
    plan::Strategy s;
    s.mode = plan::parse_mode(o->mode);
    s.bucket_mb = o->bucket_mb;
    s.batch = o->batch;
    s.accum = o->accum;
    s.bf16 = o->precision == "bf16";
    s.reduce_bf16 = o->reduce_dtype == "bf16";
    s.optimizer = o->optimizer;
    s.gpu_decode = o->decode == "gpu";
    s.reshard_after_forward = o->reshard_after_forward;
    s.accum_local = o->accum_local;
    COHORT_CHECK(!s.gpu_decode || c.gpu_decode_per_accel > 0,
                 "--decode gpu: cluster " << c.name << " has no accelerator decoding "
                                          << "(gpu_decode_per_accel is 0)");
    if (o->alone > 0) c = plan::match_throughput(p, c, s, o->alone);
    const std::vector<int> nodes = parse_nodes(o->nodes, c.nodes);

    std::printf("cohort plan: %s at %d px on %s: %d x %s per node; inside: %s; across: %d x %s\n",
                p.model.c_str(), p.image, c.name.c_str(), c.accelerators_per_node,
                c.accelerator.name.c_str(), c.intra.name.c_str(), c.nics_per_node,
                c.nic.name.c_str());
    std::printf("model: %.1f M parameters, %.2f GFLOP forward per image, %zu units (%s)\n",
                static_cast<double>(p.parameters()) / 1e6, p.forward_flops() / 1e9,
                p.units().size(), p.source.c_str());
    std::printf(
        "strategy: %s, buckets %.0f MB, batch %d x accumulation %d, %s compute, %s reduction, "
        "%s, %s decoding\n\n",
        plan::mode_name(s.mode), s.bucket_mb, s.batch, s.accum, s.bf16 ? "bf16" : "f32",
        s.reduce_bf16 ? "bf16" : "f32", s.optimizer.c_str(), s.gpu_decode ? "GPU" : "CPU");
    std::printf("%6s %6s %7s %9s %9s %9s %9s %9s %9s %10s %6s  %s\n", "nodes", "world", "batch",
                "step ms", "compute", "slowest", "comm cpu", "exp.comm", "data wait", "images/s",
                "eff %", "bound by");
    std::vector<plan::Prediction> rows;
    for (int n : nodes) {
      const plan::Prediction r = plan::predict(p, c, s, n);
      rows.push_back(r);
      std::printf("%6d %6d %7d %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10.0f %6.1f  %s\n", r.nodes,
                  r.world, r.global_batch, r.step_ms, r.compute_ms, r.straggler_ms, r.comm_cpu_ms,
                  r.exposed_comm_ms, r.data_wait_ms, r.images_per_s, 100 * r.efficiency,
                  r.bottleneck.c_str());
    }
    const plan::Prediction& last = rows.back();
    const plan::Memory& m = last.memory;
    std::printf(
        "\nmemory per accelerator (%s): parameters %.2f, gradients %.2f, optimizer %.2f, "
        "gathered %.2f, activations %.2f, buffers %.2f = %.2f GiB of %.1f usable: %s\n",
        plan::mode_name(s.mode), m.parameters / kGiB, m.gradients / kGiB, m.optimizer / kGiB,
        m.gathered / kGiB, m.activations / kGiB, m.buffers / kGiB, m.total() / kGiB,
        m.capacity / kGiB, m.fits() ? "fits" : "DOES NOT FIT");
    const std::vector<plan::Mode> fit = plan::modes_that_fit(p, c, s, last.nodes);
    std::string fit_names;
    for (plan::Mode f : fit)
      fit_names += std::string(fit_names.empty() ? "" : ", ") + plan::mode_name(f);
    std::printf("modes that fit at batch %d: %s\n", s.batch,
                fit_names.empty() ? "none" : fit_names.c_str());
    std::printf(
        "input pipeline at %d nodes: %.0f images/s needed per node, %.0f decoded (%s); "
        "%.1f decoding cores per accelerator keep up\n",
        last.nodes, last.images_needed_per_node, last.images_decoded_per_node,
        s.gpu_decode ? "on the accelerators" : "CPU cores less one per accelerator",
        last.cores_per_accelerator_needed);

    const plan::Recommendation rec = plan::recommend(p, c, s, last.nodes, o->target);
    std::printf(
        "\nrecommended for %.0f%% efficiency at %d nodes: %s, buckets %.0f MB, batch %d x "
        "accumulation %d (global %d): %.1f%%, %.0f images/s\n",
        100 * o->target, last.nodes, plan::mode_name(rec.strategy.mode), rec.strategy.bucket_mb,
        rec.strategy.batch, rec.strategy.accum, rec.prediction.global_batch,
        100 * rec.prediction.efficiency, rec.prediction.images_per_s);
    for (const std::string& why : rec.reasons) std::printf("  - %s\n", why.c_str());

    const std::string title = p.model + " on " + c.name + " (" + plan::mode_name(s.mode) +
                              ", batch " + std::to_string(s.batch) + ")";
    if (!o->svg.empty()) {
      std::filesystem::create_directories(o->svg);
      write_file(o->svg + "/efficiency.svg",
                 plan::efficiency_svg(rows, "Scaling efficiency: " + title));
      write_file(o->svg + "/breakdown.svg", plan::breakdown_svg(rows, "Step time: " + title));
      std::printf("\nplots: %s/efficiency.svg, %s/breakdown.svg\n", o->svg.c_str(), o->svg.c_str());
    }
    if (!o->json.empty()) {
      nlohmann::json j;
      j["model"] = {{"name", p.model},
                    {"image", p.image},
                    {"parameters", p.parameters()},
                    {"forward_flops", p.forward_flops()},
                    {"source", p.source}};
      j["cluster"] = {{"name", c.name},
                      {"source", c.source},
                      {"accelerators_per_node", c.accelerators_per_node},
                      {"accelerator", c.accelerator.name},
                      {"nic", c.nic.name},
                      {"nic_gbytes_per_s", c.nic.gbytes_per_s},
                      {"nics_per_node", c.nics_per_node}};
      j["strategy"] = strategy_json(s);
      j["rows"] = nlohmann::json::array();
      for (const plan::Prediction& r : rows) j["rows"].push_back(row_json(r));
      j["modes_that_fit"] = nlohmann::json::array();
      for (plan::Mode f : fit) j["modes_that_fit"].push_back(plan::mode_name(f));
      j["recommendation"] = {{"target", o->target},
                             {"reached", rec.reached},
                             {"strategy", strategy_json(rec.strategy)},
                             {"prediction", row_json(rec.prediction)},
                             {"reasons", rec.reasons}};
      write_file(o->json, j.dump(1) + "\n");
    }
    return 0;
  };
}

}  // namespace cohort::cli
