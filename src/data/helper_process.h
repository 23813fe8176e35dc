// A helper process per calling thread that runs one kind of request (decoding a file with a
// library we do not trust on hostile input), so that the library's abort, crash or endless loop
// ends the helper, not the training process: the caller gets a DecodeError naming the file and
// what happened, and the next request starts a fresh helper. Internal to cohort::data.
//
// The wire, over a Unix socket pair (the helper's stdin and stdout): a request is the file's
// name and bytes; a reply is a status byte (0: the handler's result, 1: its error message), a
// head (a small record, or the message) and a body (the bulk: pixels), each read straight into
// its place without another copy (a fresh 8 MB buffer costs 25 ms of page faults on this VM). The
// helper's stderr goes to a pipe the caller reads when the helper dies, for the library's last
// words (GDCM's assertion).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace cohort::data {

struct HelperReply {
  bool ok = false;
  std::string head;           // the handler's record, or its error message
  std::vector<uint8_t> body;  // the handler's bulk
};

// Sends (name, bytes) to this thread's helper, started from `path` at first use (and again after
// one died), and waits at most timeout_s for the reply. Throws DecodeError naming `name` when
// the helper dies or overruns (it is then killed), std::runtime_error when it cannot start.
HelperReply ask_helper(const std::string& path, const std::string& name,
                       std::span<const uint8_t> bytes, double timeout_s);

// The helper's side: answers requests on stdin/stdout with `handle` until stdin closes, then
// returns 0. What `handle` throws goes back as an error reply. The helper dies with the thread
// that started it (PR_SET_PDEATHSIG).
struct HelperResult {
  std::string head;
  std::vector<uint8_t> body;
};
using HelperHandler =
    std::function<HelperResult(std::span<const uint8_t> bytes, const std::string& name)>;
int serve_helper(const HelperHandler& handle);

}  // namespace cohort::data
