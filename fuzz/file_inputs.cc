// Writes one fuzz input as the file its first byte names, and reads it as Cohort does.
#include "file_inputs.h"

#include <filesystem>
#include <fstream>
#include <string_view>

#include "cohort/core/error.h"
#include "cohort/data/shards.h"
#include "cohort/data/source.h"
#include "cohort/dist/checkpoint.h"
#include "cohort/nn/safetensors.h"
#include "cohort/plan/plan.h"
#include "cohort/train/config.h"
#include "cohort/train/report.h"

namespace cohort::fuzz {

namespace fs = std::filesystem;

namespace {

void write(const std::string& path, std::string_view bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("fuzz harness: cannot write " + path);
}

void read_as(FileKind kind, std::string_view bytes, const std::string& dir, std::string* named) {
  switch (kind) {
    case FileKind::safetensors: {
      *named = dir + "/in.safetensors";
      write(*named, bytes);
      nn::load_safetensors(*named);
      return;
    }
    case FileKind::shard: {
      *named = dir + "/shards";
      write(*named + "/in.cshard", bytes);
      auto src = data::open_shards(*named);
      std::vector<uint8_t> scratch;
      for (size_t i = 0; i < src->size(); ++i) {
        src->name(i);
        src->labels(i);
        src->bytes(i, scratch);
      }
      return;
    }
    case FileKind::checkpoint: {
      *named = dir + "/checkpoint";
      const size_t cut = bytes.find(kCheckpointSeparator);
      write(*named + "/checkpoint.json", bytes.substr(0, cut));
      if (cut != std::string_view::npos) {
        write(*named + "/piece.safetensors", bytes.substr(cut + sizeof(kCheckpointSeparator) - 1));
      }
      dist::read_checkpoint_position(*named);
      dist::describe_checkpoint(*named);
      dist::consolidate_checkpoint(*named, dir + "/consolidated.safetensors");
      return;
    }
    case FileKind::config_toml:
    case FileKind::config_json: {
      *named = dir + (kind == FileKind::config_toml ? "/train.toml" : "/train.json");
      write(*named, bytes);
      train::TrainConfig c;
      train::apply_config_file(c, *named);
      return;
    }
    case FileKind::csv_list: {
      *named = dir + "/list.csv";
      write(*named, bytes);
      std::vector<std::string> names;
      data::read_csv_list(*named, &names);
      return;
    }
    case FileKind::cluster_toml:
    case FileKind::cluster_json: {
      *named = dir + (kind == FileKind::cluster_toml ? "/cluster.toml" : "/cluster.json");
      write(*named, bytes);
      plan::load_cluster(*named);
      return;
    }
    case FileKind::profile: {
      *named = dir + "/profile.json";
      write(*named, bytes);
      plan::read_profile(*named);
      return;
    }
    case FileKind::run_log: {
      *named = dir + "/run.json";
      write(*named, bytes);
      train::write_report({train::read_run_log(*named)}, dir + "/report", false);
      return;
    }
    case FileKind::count:
      break;
  }
}

}  // namespace

const char* file_kind_name(FileKind k) {
  static const char* names[] = {"safetensors", "shard",    "checkpoint",   "config-toml",
                                "config-json", "csv-list", "cluster-toml", "cluster-json",
                                "profile",     "run-log"};
  return k < FileKind::count ? names[static_cast<size_t>(k)] : "?";
}

FileKind read_fuzzed_file(const uint8_t* data, size_t size, const std::string& scratch) {
  if (size == 0) return FileKind::count;
  const auto kind = static_cast<FileKind>(data[0] % static_cast<uint8_t>(FileKind::count));
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string named;
  try {
    read_as(kind, bytes, scratch, &named);
  } catch (const Error& e) {
    if (std::string(e.what()).find(named) == std::string::npos) {
      throw UnnamedRefusal(std::string(file_kind_name(kind)) + ": a refusal that does not name " +
                           named + ": " + e.what());
    }
    throw;
  }
  return kind;
}

}  // namespace cohort::fuzz
