#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/data/image.h"
#include "cohort/data/shards.h"
#include "cohort/data/source.h"

namespace fs = std::filesystem;

namespace cohort::data {

std::vector<Sample> scan_image_folder(const std::string& dir, std::vector<std::string>* classes) {
  if (!fs::is_directory(dir)) COHORT_THROW("data source '" << dir << "' is not a folder");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory()) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  if (names.empty()) COHORT_THROW("'" << dir << "' has no class sub-folders (ImageFolder layout)");
  std::vector<Sample> out;
  for (size_t c = 0; c < names.size(); ++c) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(fs::path(dir) / names[c])) {
      if (e.is_regular_file()) files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    for (auto& f : files) out.push_back(Sample{f, {static_cast<int>(c)}});
  }
  if (classes) *classes = names;
  if (out.empty()) COHORT_THROW("'" << dir << "' holds no files");
  return out;
}

std::vector<Sample> read_csv_list(const std::string& csv_path, std::vector<std::string>* names) {
  std::ifstream in(csv_path);
  if (!in) COHORT_THROW("cannot open CSV list '" << csv_path << "'");
  const fs::path base = fs::path(csv_path).parent_path();
  std::vector<Sample> out;
  std::vector<std::string> findings;  // a findings table's label columns
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::string cell;
    if (line_no == 1) {  // the header
      std::getline(ss, cell, ',');
      while (std::getline(ss, cell, ',')) findings.push_back(cell);
      const bool named =
          findings.size() >= 2 && std::none_of(findings.begin(), findings.end(),
                                               [](const std::string& h) { return h == "label"; });
      if (!named) findings.clear();
      continue;
    }
    Sample s;
    std::getline(ss, s.path, ',');
    size_t column = 0;
    while (std::getline(ss, cell, ',')) {
      char* end = nullptr;
      long v = std::strtol(cell.c_str(), &end, 10);
      if (cell.empty() || *end != '\0') {
        COHORT_THROW(csv_path << ":" << line_no << ": label '" << cell << "' is not an integer");
      }
      if (!findings.empty()) {
        if (v != 0 && v != 1) {
          COHORT_THROW(csv_path << ":" << line_no << ": finding '"
                                << (column < findings.size() ? findings[column] : "?") << "' is "
                                << v << "; a findings table holds 0 or 1");
        }
        if (v == 1) s.labels.push_back(static_cast<int>(column));
      } else {
        s.labels.push_back(static_cast<int>(v));
      }
      ++column;
    }
    if (!findings.empty() && column != findings.size()) {
      COHORT_THROW(csv_path << ":" << line_no << ": " << column << " findings; the header names "
                            << findings.size());
    }
    if (findings.empty() && s.labels.empty()) {
      COHORT_THROW(csv_path << ":" << line_no << ": no label after the path");
    }
    if (fs::path(s.path).is_relative()) s.path = (base / s.path).string();
    out.push_back(std::move(s));
  }
  if (out.empty()) COHORT_THROW("CSV list '" << csv_path << "' has no samples");
  if (names) *names = findings;
  return out;
}

namespace {

class FileSource final : public Source {
 public:
  FileSource(std::vector<Sample> s, std::vector<std::string> names)
      : s_(std::move(s)), names_(std::move(names)) {
    if (s_.empty()) COHORT_THROW("the data source has no samples");
  }
  std::vector<std::string> class_names() const override { return names_; }
  size_t size() const override { return s_.size(); }
  const std::vector<int>& labels(size_t i) const override { return s_[i].labels; }
  std::string name(size_t i) const override { return s_[i].path; }
  std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>& scratch) const override {
    // Read, not mapped: for 2048 px scans (8 MB) a mapping's page faults cost more than the copy
    // (bench data's crop+resize, which then touches the pages, 1.9 -> 6.5 ms; 6.1 with
    // MAP_POPULATE).
    read_file_into(s_[i].path, scratch);
    return scratch;
  }

 private:
  std::vector<Sample> s_;
  std::vector<std::string> names_;
};

}  // namespace

std::shared_ptr<Source> file_source(std::vector<Sample> samples,
                                    std::vector<std::string> class_names) {
  return std::make_shared<FileSource>(std::move(samples), std::move(class_names));
}

std::shared_ptr<Source> open_source(const std::string& path) {
  std::vector<std::string> names;
  if (fs::is_regular_file(path) && fs::path(path).extension() == ".csv") {
    auto samples = read_csv_list(path, &names);
    return file_source(std::move(samples), std::move(names));
  }
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path)) {
      if (e.path().extension() == ".cshard") return open_shards(path);
    }
  }
  auto samples = scan_image_folder(path, &names);
  return file_source(std::move(samples), std::move(names));
}

}  // namespace cohort::data
