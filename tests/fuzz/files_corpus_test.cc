// Replays the committed fuzz_files corpus (fuzz/corpus/files) in the ordinary build, as the fuzz
// target reads it: every seed (a valid file of each kind, made by Cohort's writers) is read, and
// every input a campaign found (regress-*) is refused with a cohort::Error naming the file. A
// regression of a fix crashes this binary, or escapes as another exception, and fails the test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "cohort/core/error.h"
#include "file_inputs.h"

namespace fs = std::filesystem;
using cohort::fuzz::FileKind;

TEST(FuzzFiles, CommittedInputsAreReadOrRefusedNamingTheFile) {
  const fs::path corpus = fs::path(COHORT_SOURCE_DIR) / "fuzz/corpus/files";
  const fs::path scratch =
      fs::temp_directory_path() / ("cohort-files-corpus-" + std::to_string(::getpid()));
  std::map<std::string, int> seeds_read;
  int regressions = 0, refused = 0;
  for (const auto& e : fs::directory_iterator(corpus)) {
    fs::remove_all(scratch);
    fs::create_directories(scratch);
    std::ifstream in(e.path(), std::ios::binary);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
    const std::string name = e.path().filename().string();
    const bool regression = name.rfind("regress-", 0) == 0;
    regressions += regression;
    try {
      const FileKind k = cohort::fuzz::read_fuzzed_file(bytes.data(), bytes.size(), scratch);
      EXPECT_FALSE(regression) << name << " was read as a valid " << file_kind_name(k);
      if (!regression) seeds_read[file_kind_name(k)]++;
    } catch (const cohort::Error& err) {
      ++refused;
      EXPECT_TRUE(regression) << name << " (a seed) was refused: " << err.what();
    } catch (const std::exception& err) {
      ADD_FAILURE() << name << ": " << err.what();
    }
  }
  fs::remove_all(scratch);
  // A seed of every kind was read.
  for (int k = 0; k < static_cast<int>(FileKind::count); ++k) {
    const char* kind = file_kind_name(static_cast<FileKind>(k));
    EXPECT_GE(seeds_read[kind], 1) << "no seed of kind " << kind << " in " << corpus;
  }
  EXPECT_GE(regressions, 3);
  EXPECT_EQ(refused, regressions);
}
