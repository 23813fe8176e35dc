// Where encoded samples come from: files (an ImageFolder or a CSV list) or record shards. A
// Source owns sharding-independent access by data set index; the Sampler decides which indices
// a rank reads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace cohort::data {

struct Sample {
  std::string path;
  std::vector<int> labels;  // one label per class task; several for multi-label findings
};

class Source {
 public:
  virtual ~Source() = default;
  virtual size_t size() const = 0;
  virtual const std::vector<int>& labels(size_t i) const = 0;
  virtual std::string name(size_t i) const = 0;  // what error messages call sample i
  // The name of each class or finding where the source knows them (ImageFolder: its folders;
  // a findings table: its header); empty otherwise.
  virtual std::vector<std::string> class_names() const { return {}; }
  // The encoded bytes of sample i: read into `scratch`, or a view of memory the source owns.
  // A damaged record throws DecodeError naming it.
  virtual std::span<const uint8_t> bytes(size_t i, std::vector<uint8_t>& scratch) const = 0;
};

// ImageFolder layout: one sub-folder per class, sorted by name; label = folder index.
std::vector<Sample> scan_image_folder(const std::string& dir, std::vector<std::string>* classes);
// CSV: a header line, then path,label[,label...] (class indices); relative paths are relative
// to the CSV. A header that names two or more label columns other than "label"
// (path,Atelectasis,Effusion,...) makes it a findings table: each row holds 0 or 1 per finding,
// the sample's labels are the findings marked 1 (none for a normal scan), and `names` receives
// the findings' names.
std::vector<Sample> read_csv_list(const std::string& csv_path,
                                  std::vector<std::string>* names = nullptr);

std::shared_ptr<Source> file_source(std::vector<Sample> samples,
                                    std::vector<std::string> class_names = {});
// A folder of record shards (*.cshard), a .csv list, or an ImageFolder.
std::shared_ptr<Source> open_source(const std::string& path);

}  // namespace cohort::data
