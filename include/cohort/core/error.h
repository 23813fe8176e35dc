// Errors carry the file:line that raised them and the values involved, so that a failure on
// rank 7 of 64 can be read without a debugger.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace cohort {

class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& what);
  const std::string& message() const { return message_; }  // without file:line

 private:
  std::string message_;
};

// A peer or link failed; the communicator that raised it is unusable afterwards.
class CommError : public Error {
 public:
  using Error::Error;
};

// A wait ran past its deadline.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

std::string errno_string(int err);

}  // namespace cohort

#define COHORT_STR(...) \
  (static_cast<std::ostringstream&&>(std::ostringstream() << __VA_ARGS__).str())
#define COHORT_THROW(...) throw ::cohort::Error(__FILE__, __LINE__, COHORT_STR(__VA_ARGS__))
#define COHORT_THROW_AS(type, ...) throw type(__FILE__, __LINE__, COHORT_STR(__VA_ARGS__))
#define COHORT_CHECK(cond, ...)                                            \
  do {                                                                     \
    if (!(cond)) COHORT_THROW("check failed: " #cond ": " << __VA_ARGS__); \
  } while (0)
