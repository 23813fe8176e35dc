// Clusters: the presets (their figures and sources are in docs/plan.md), and cluster files in
// TOML or JSON that start from a preset (`base`) or from nothing and set any field.
#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/core/json_number.h"
#include "cohort/plan/plan.h"

namespace cohort::plan {

namespace {

Cluster dgx_h100() {
  Cluster c;
  c.name = "dgx-h100";
  c.source = "NVIDIA H100 and DGX H100 datasheets; NCCL tuning tables for latencies";
  c.accelerators_per_node = 8;
  c.accelerator = {"H100 SXM 80GB", 989, 67, 80, 3350, 0.45, 0.6};
  c.intra = {"NVLink 4 (900 GB/s both ways)", 450, kNvlinkLatencyUs};
  c.nic = {"ConnectX-7 InfiniBand NDR 400 Gb/s", 50, kNetLatencyUs};
  c.nics_per_node = 8;
  c.cpu_cores = 112;  // 2x Xeon Platinum 8480C
  c.decode_per_core = 500;
  c.gpu_decode_per_accel = 4000;
  c.reduce_gbytes_per_s = 1000;
  return c;
}

Cluster dgx_a100() {
  Cluster c;
  c.name = "dgx-a100";
  c.source = "NVIDIA A100 and DGX A100 datasheets; NCCL tuning tables for latencies";
  c.accelerators_per_node = 8;
  c.accelerator = {"A100 SXM 80GB", 312, 19.5, 80, 2039, 0.45, 0.6};
  c.intra = {"NVLink 3 (600 GB/s both ways)", 300, kNvlinkLatencyUs};
  c.nic = {"ConnectX-6 InfiniBand HDR 200 Gb/s", 25, kNetLatencyUs};
  c.nics_per_node = 8;
  c.cpu_cores = 128;  // 2x AMD EPYC 7742
  c.decode_per_core = 500;
  c.gpu_decode_per_accel = 4000;
  c.reduce_gbytes_per_s = 700;
  return c;
}

Cluster a100_pcie_100gbe() {
  Cluster c;
  c.name = "a100-pcie-100gbe";
  c.source = "NVIDIA A100 PCIe datasheet; PCIe 4.0 x16; one 100 GbE NIC per node";
  c.accelerators_per_node = 8;
  c.accelerator = {"A100 PCIe 80GB", 312, 19.5, 80, 1935, 0.45, 0.6};
  c.intra = {"PCIe 4.0 x16 (through the host bridge)", 12, kPcieLatencyUs};
  c.nic = {"100 GbE (TCP)", 12.5, 25};
  c.nics_per_node = 1;
  c.cpu_cores = 64;
  c.decode_per_core = 500;
  c.gpu_decode_per_accel = 4000;
  c.reduce_gbytes_per_s = 700;
  return c;
}

// This class of machine as measured here (docs/plan.md): one rank per core, the CPU as the
// accelerator, shared memory inside the host; `cohort plan --calibrate` measures the real one.
Cluster cpu_host() {
  Cluster c;
  c.name = "cpu-host";
  c.source = "measured on the 2-core AVX-512 development machine (docs/plan.md)";
  c.accelerators_per_node = 2;
  c.accelerator = {"one x86 core, AVX-512", 0.14, 0.14, 12, 10, 0.45, 0.6};
  // CPU time per byte a rank moves: a copy at about 30 GB/s of read and write traffic through
  // shared memory, and TCP on loopback, both as --calibrate measured them (2026-12-05).
  c.intra = {"shared memory", 5, 1, 0.07};
  c.nic = {"emulated 1 Gbit/s (tc tbf)", 0.125, 60, 0.17};
  c.nics_per_node = 1;
  c.cpu_cores = 2;
  c.decode_per_core = 490;
  c.reduce_gbytes_per_s = 6;
  return c;
}

const std::map<std::string, std::function<Cluster()>>& presets() {
  static const std::map<std::string, std::function<Cluster()>> p{
      {"dgx-h100", dgx_h100},
      {"dgx-a100", dgx_a100},
      {"a100-pcie-100gbe", a100_pcie_100gbe},
      {"cpu-host", cpu_host},
  };
  return p;
}

// One cluster field: its name in files, and where it lives.
struct Field {
  const char* key;
  std::function<double&(Cluster&)> number;
  std::function<std::string&(Cluster&)> text;
};

const std::vector<Field>& fields() {
  auto num = [](const char* k, std::function<double&(Cluster&)> f) { return Field{k, f, {}}; };
  auto txt = [](const char* k, std::function<std::string&(Cluster&)> f) { return Field{k, {}, f}; };
  static const std::vector<Field> f{
      txt("name", [](Cluster& c) -> std::string& { return c.name; }),
      txt("source", [](Cluster& c) -> std::string& { return c.source; }),
      txt("accelerator", [](Cluster& c) -> std::string& { return c.accelerator.name; }),
      num("bf16_tflops", [](Cluster& c) -> double& { return c.accelerator.bf16_tflops; }),
      num("f32_tflops", [](Cluster& c) -> double& { return c.accelerator.f32_tflops; }),
      num("memory_gib", [](Cluster& c) -> double& { return c.accelerator.memory_gib; }),
      num("memory_gbs", [](Cluster& c) -> double& { return c.accelerator.memory_gbs; }),
      num("compute_efficiency",
          [](Cluster& c) -> double& { return c.accelerator.compute_efficiency; }),
      num("memory_efficiency",
          [](Cluster& c) -> double& { return c.accelerator.memory_efficiency; }),
      txt("intra", [](Cluster& c) -> std::string& { return c.intra.name; }),
      num("intra_gbytes_per_s", [](Cluster& c) -> double& { return c.intra.gbytes_per_s; }),
      num("intra_latency_us", [](Cluster& c) -> double& { return c.intra.latency_us; }),
      num("intra_cpu_ns_per_byte", [](Cluster& c) -> double& { return c.intra.cpu_ns_per_byte; }),
      txt("nic", [](Cluster& c) -> std::string& { return c.nic.name; }),
      num("nic_gbytes_per_s", [](Cluster& c) -> double& { return c.nic.gbytes_per_s; }),
      num("nic_latency_us", [](Cluster& c) -> double& { return c.nic.latency_us; }),
      num("nic_cpu_ns_per_byte", [](Cluster& c) -> double& { return c.nic.cpu_ns_per_byte; }),
      num("decode_per_core", [](Cluster& c) -> double& { return c.decode_per_core; }),
      num("gpu_decode_per_accel", [](Cluster& c) -> double& { return c.gpu_decode_per_accel; }),
      num("reduce_gbytes_per_s", [](Cluster& c) -> double& { return c.reduce_gbytes_per_s; }),
      num("step_overhead_ms", [](Cluster& c) -> double& { return c.step_overhead_ms; }),
      num("step_jitter", [](Cluster& c) -> double& { return c.step_jitter; }),
  };
  return f;
}

// Whole-number fields.
struct IntField {
  const char* key;
  int Cluster::*member;
};
constexpr IntField kIntFields[] = {
    {"nodes", &Cluster::nodes},
    {"accelerators_per_node", &Cluster::accelerators_per_node},
    {"nics_per_node", &Cluster::nics_per_node},
    {"cpu_cores", &Cluster::cpu_cores},
};

std::string preset_list() {
  std::string s;
  for (const auto& n : cluster_presets()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The file as JSON (TOML converted), so that both read through one path.
nlohmann::json read_as_json(const std::string& path) {
  std::ifstream f(path);
  COHORT_CHECK(f, "cluster " << path << ": cannot open (presets: " << preset_list() << ")");
  std::stringstream text;
  text << f.rdbuf();
  const bool is_toml = path.size() > 5 && path.compare(path.size() - 5, 5, ".toml") == 0;
  try {
    if (!is_toml) return nlohmann::json::parse(text.str());
    toml::table t = toml::parse(text.str(), path);
    std::stringstream js;
    js << toml::json_formatter{t};
    return nlohmann::json::parse(js.str());
  } catch (const toml::parse_error& e) {
    COHORT_THROW("cluster " << path << ": line " << e.source().begin.line << ": "
                            << e.description());
  } catch (const nlohmann::json::exception& e) {
    COHORT_THROW("cluster " << path << ": not JSON: " << e.what());
  }
}

void check(const Cluster& c, const std::string& where) {
  auto positive = [&](double v, const char* key) {
    COHORT_CHECK(v > 0, where << ": field '" << key << "' is " << v << ": expected > 0");
  };
  positive(c.nodes, "nodes");
  positive(c.accelerators_per_node, "accelerators_per_node");
  positive(c.accelerator.bf16_tflops, "bf16_tflops");
  positive(c.accelerator.f32_tflops, "f32_tflops");
  positive(c.accelerator.memory_gib, "memory_gib");
  positive(c.accelerator.memory_gbs, "memory_gbs");
  positive(c.accelerator.compute_efficiency, "compute_efficiency");
  positive(c.accelerator.memory_efficiency, "memory_efficiency");
  positive(c.intra.gbytes_per_s, "intra_gbytes_per_s");
  positive(c.nic.gbytes_per_s, "nic_gbytes_per_s");
  positive(c.nics_per_node, "nics_per_node");
  positive(c.cpu_cores, "cpu_cores");
  positive(c.decode_per_core, "decode_per_core");
  positive(c.reduce_gbytes_per_s, "reduce_gbytes_per_s");
  COHORT_CHECK(c.intra.cpu_ns_per_byte >= 0 && c.nic.cpu_ns_per_byte >= 0,
               where << ": intra_cpu_ns_per_byte " << c.intra.cpu_ns_per_byte
                     << " and nic_cpu_ns_per_byte " << c.nic.cpu_ns_per_byte
                     << ": CPU time per byte is >= 0");
  COHORT_CHECK(c.step_jitter >= 0 && c.step_jitter < 1 && c.step_overhead_ms >= 0,
               where << ": step_jitter is a fraction in [0, 1) and step_overhead_ms >= 0");
  COHORT_CHECK(c.accelerator.compute_efficiency <= 1 && c.accelerator.memory_efficiency <= 1,
               where << ": compute_efficiency and memory_efficiency are fractions of peak (<= 1)");
}

}  // namespace

std::vector<std::string> cluster_presets() {
  std::vector<std::string> n;
  for (const auto& [name, f] : presets()) n.push_back(name);
  return n;
}

Cluster preset_cluster(const std::string& name) {
  auto it = presets().find(name);
  COHORT_CHECK(it != presets().end(),
               "no cluster preset '" << name << "' (presets: " << preset_list() << ")");
  return it->second();
}

Cluster load_cluster(const std::string& name_or_path) {
  if (presets().count(name_or_path)) return preset_cluster(name_or_path);
  const std::string& path = name_or_path;
  const nlohmann::json j = read_as_json(path);
  COHORT_CHECK(j.is_object(), "cluster " << path << ": expected a table of fields");
  Cluster c;
  if (j.contains("base")) {
    COHORT_CHECK(j["base"].is_string(), path << ": field 'base': expected a preset name");
    const std::string base = j["base"].get<std::string>();
    COHORT_CHECK(presets().count(base), path << ": field 'base': no cluster preset '" << base
                                             << "' (presets: " << preset_list() << ")");
    c = preset_cluster(base);
  } else {
    c.name = path;
  }
  c.source = path;
  for (const auto& [key, value] : j.items()) {
    if (key == "base") continue;
    bool known = false;
    for (const Field& f : fields()) {
      if (key != f.key) continue;
      known = true;
      if (f.number) {
        COHORT_CHECK(value.is_number(),
                     path << ": field '" << key << "': expected a number, got " << value.dump());
        f.number(c) = value.get<double>();
      } else {
        COHORT_CHECK(value.is_string(),
                     path << ": field '" << key << "': expected text, got " << value.dump());
        f.text(c) = value.get<std::string>();
      }
    }
    for (const IntField& f : kIntFields) {
      if (key != f.key) continue;
      known = true;
      // An integer beyond int would wrap in get<int>(): 4294967298 nodes read as 2.
      COHORT_CHECK(
          value.is_number_integer() && holds_whole_number<int>(value),
          path << ": field '" << key << "': expected a whole number, got " << value.dump());
      c.*f.member = value.get<int>();
    }
    COHORT_CHECK(known, path << ": unknown field '" << key << "' (see docs/plan.md)");
  }
  check(c, "cluster " + path);
  return c;
}

void write_cluster(const Cluster& c, const std::string& path) {
  nlohmann::json j;
  Cluster copy = c;
  for (const Field& f : fields()) {
    if (f.number) {
      j[f.key] = f.number(copy);
    } else {
      j[f.key] = f.text(copy);
    }
  }
  for (const IntField& f : kIntFields) j[f.key] = c.*f.member;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    COHORT_CHECK(out, "cluster " << tmp << ": cannot write");
    out << j.dump(1) << "\n";
    COHORT_CHECK(out.good(), "cluster " << tmp << ": write failed (disk full?)");
  }
  COHORT_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0,
               "cluster " << path << ": rename failed");
}

}  // namespace cohort::plan
