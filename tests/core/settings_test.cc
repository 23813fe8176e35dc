// Every COHORT_* setting is read in one place (src/core/settings.cc) and documented in README's
// table: the two lists are the same, and a malformed value of each typed one is an error that
// names the variable.
#include "cohort/core/settings.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "cohort/core/error.h"

using namespace cohort;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::set<std::string> names(const std::string& text, const std::regex& re) {
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    out.insert((*it)[1]);
  }
  return out;
}

}  // namespace

TEST(Settings, TheReadmeTableListsExactlyTheVariablesRead) {
  const std::string readme = read(std::string(COHORT_SOURCE_DIR) + "/README.md");
  const size_t table = readme.find("## Environment");
  ASSERT_NE(table, std::string::npos);
  const std::string section = readme.substr(table, readme.find("\n## ", table + 1) - table);
  // Rows of the table: "| `COHORT_X` | ..." (a row may name two, "`A`, `B`").
  std::set<std::string> documented;
  std::istringstream lines(section);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::string first = line.substr(0, line.find(" | "));
    for (const auto& n : names(first, std::regex("`(COHORT_[A-Z0-9_]+)`"))) documented.insert(n);
  }
  const std::string code = read(std::string(COHORT_SOURCE_DIR) + "/src/core/settings.cc");
  const std::set<std::string> read_here = names(code, std::regex("\"(COHORT_[A-Z0-9_]+)\""));
  EXPECT_FALSE(read_here.empty());
  for (const auto& n : read_here)
    EXPECT_TRUE(documented.count(n)) << n << " is read, not documented";
  for (const auto& n : documented)
    EXPECT_TRUE(read_here.count(n)) << n << " is documented, not read";
}

TEST(Settings, MalformedValuesNameTheVariable) {
  const std::pair<const char*, const char*> bad[] = {
      {"COHORT_TIMEOUT", "soon"},     {"COHORT_TCP_STREAMS", "0"},
      {"COHORT_TCP_STREAMS", "two"},  {"COHORT_SHM_RING_BYTES", "4Q"},
      {"COHORT_RING_SLICE", "big"},   {"COHORT_HIER_CHUNK", "-"},
      {"COHORT_SPIN", "1.5"},         {"COHORT_CALLER_RUNS", "maybe"},
      {"COHORT_UCX_CHUNK", "256 K"},  {"COHORT_UCX_CHUNKS", "x"},
      {"COHORT_ALLOC_CACHE", "no"},   {"COHORT_LOG", "verbose"},
      {"COHORT_DECODE_TIMEOUT", "0"}, {"COHORT_DECODE_TIMEOUT", "later"},
  };
  for (const auto& [name, value] : bad) {
    setenv(name, value, 1);
    try {
      env::Settings::read();
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    unsetenv(name);
  }
  // Well-formed values arrive typed.
  setenv("COHORT_SHM_RING_BYTES", "64K", 1);
  setenv("COHORT_TIMEOUT", "2.5", 1);
  setenv("COHORT_NO_AVX2", "1", 1);
  setenv("COHORT_HOST_ID", "nodeA", 1);
  const env::Settings s = env::Settings::read();
  EXPECT_EQ(s.shm_ring_bytes, 64u << 10);
  EXPECT_DOUBLE_EQ(s.timeout_s, 2.5);
  EXPECT_TRUE(s.no_avx2);
  EXPECT_EQ(s.host_id.value_or(""), "nodeA");
  for (const char* n :
       {"COHORT_SHM_RING_BYTES", "COHORT_TIMEOUT", "COHORT_NO_AVX2", "COHORT_HOST_ID"})
    unsetenv(n);
}
