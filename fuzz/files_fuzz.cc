// Feeds arbitrary bytes to every reader of the files Cohort takes from users and from earlier
// runs (see file_inputs.h). Any input may be refused with a cohort::Error that names the file;
// none may crash, abort, read out of bounds, allocate without bound, escape as another
// exception, or be refused without naming the file.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>

#include "cohort/core/error.h"
#include "file_inputs.h"

namespace {

std::string scratch;  // a private folder under $TMPDIR, emptied before each input

void remove_scratch() {
  std::error_code ec;
  std::filesystem::remove_all(scratch, ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/cohort-fuzz-files.XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("fuzz_files: mkdtemp");
    std::abort();
  }
  scratch = pattern;
  std::atexit(remove_scratch);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(scratch, ec)) {
    std::filesystem::remove_all(e.path(), ec);
  }
  try {
    cohort::fuzz::read_fuzzed_file(data, size, scratch);
  } catch (const cohort::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_files: escaped: %s\n", e.what());
    __builtin_trap();
  }
  return 0;
}
