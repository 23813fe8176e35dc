// split(color, key): every rank publishes its (color, key) in the store; the members of each
// color build a fresh communicator with its own store namespace and links.
#include <algorithm>
#include <cstdio>

#include "cohort/core/error.h"
#include "native_comm.h"

namespace cohort::comm::detail {

std::shared_ptr<Communicator> NativeComm::split(int color, int key) {
  // Everyone publishes (color, key); members of each color then build a fresh communicator
  // with its own store namespace and links.
  const uint32_t seq = split_seq_++;
  const std::string base = "split" + std::to_string(seq) + "/";
  barrier().wait();  // the split is ordered with respect to earlier collectives
  store_.set(base + std::to_string(rank_), std::to_string(color) + " " + std::to_string(key));
  std::vector<std::pair<int, int>> mine;  // (key, rank)
  for (int r = 0; r < size(); ++r) {
    std::string v = store_.get(base + std::to_string(r));
    int c = 0, k = 0;
    if (std::sscanf(v.c_str(), "%d %d", &c, &k) != 2) {
      COHORT_THROW_AS(CommError, "split: malformed entry from rank " << r << ": '" << v << "'");
    }
    if (c == color) mine.emplace_back(k, r);
  }
  if (color < 0) return nullptr;
  std::sort(mine.begin(), mine.end());
  std::vector<PeerDesc> members;
  int new_rank = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    PeerDesc d = members_[static_cast<size_t>(mine[i].second)];
    if (mine[i].second == rank_) new_rank = static_cast<int>(i);
    d.rank = static_cast<int>(i);
    members.push_back(d);
  }
  std::string name = name_ + "/s" + std::to_string(seq) + "c" + std::to_string(color);
  return std::make_shared<NativeComm>(store_.prefixed(name + "/"), token_, name, new_rank, members,
                                      settings_);
}

}  // namespace cohort::comm::detail
