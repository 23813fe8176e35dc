// `cohort topo`: what a job sees: hosts, ranks per host, the transport to every peer, the link
// figures of the cost model (measured with COHORT_PROBE=1) and the algorithm it picks per size.
#include <cstdio>

#include "cohort/comm/communicator.h"
#include "verbs.h"

namespace cohort::cli {

Run add_topo(CLI::App& app) {
  auto all = std::make_shared<bool>(false);
  app.add_flag("--all-ranks", *all, "Every rank prints its transports (default: rank 0 only)");
  return [all]() -> int {
    auto c = comm::init();
    for (int r = 0; r < c->size(); ++r) {
      if (r == c->rank() && (r == 0 || *all)) {
        std::printf("%s", c->topology_report().c_str());
        std::fflush(stdout);
      }
      c->barrier().wait();  // one rank's report at a time
    }
    return 0;
  };
}

}  // namespace cohort::cli
