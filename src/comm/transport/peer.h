// What a transport knows about the rank at the other end of a link.
#pragma once

#include <string>

namespace cohort::comm {

struct PeerDesc {
  int rank = -1;
  std::string host;
  int pid = 0;
  std::string name() const { return "rank " + std::to_string(rank) + " (host " + host + ")"; }
};

}  // namespace cohort::comm
