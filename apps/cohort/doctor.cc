// `cohort doctor DIR`: reads every rank's flight-recorder dump (COHORT_FLIGHT_DIR) and says what
// happened, one sentence per finding: which rank never entered the call the others wait in, which
// entered it long after them, which is in another collective under the same call number, whom
// the waiting ranks wait on, which ranks left no dump, and why each rank dumped.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "verbs.h"

namespace cohort::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// "rank 3", "ranks 0-2 and 4-7".
std::string ranks_text(std::vector<int> rs) {
  std::sort(rs.begin(), rs.end());
  rs.erase(std::unique(rs.begin(), rs.end()), rs.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < rs.size();) {
    size_t j = i;
    while (j + 1 < rs.size() && rs[j + 1] == rs[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(rs[i])
                           : std::to_string(rs[i]) + "-" + std::to_string(rs[j]));
    i = j + 1;
  }
  std::string s = rs.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < parts.size(); ++i) {
    s += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  }
  return s;
}

struct RankState {
  json dump;
  const json* stuck = nullptr;  // the oldest collective not done: where this rank is
  long last_seq = -1;           // the newest collective it issued
  const json* last = nullptr;
};

bool collective(const json& c) {
  const std::string k = c["kind"].get<std::string>();
  return k != "send" && k != "recv";
}

std::string call_text(const json& c) {
  return c["kind"].get<std::string>() + " #" + std::to_string(c["seq"].get<long>());
}

std::vector<std::string> diagnose(const std::string& comm, std::map<int, RankState>& ranks) {
  std::vector<std::string> out;
  const int world = ranks.begin()->second.dump["world"].get<int>();
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (!ranks.count(r)) missing.push_back(r);
  }
  for (auto& [r, s] : ranks) {
    for (const json& c : s.dump["calls"]) {
      if (!collective(c)) continue;
      if (c["seq"].get<long>() >= s.last_seq) {
        s.last_seq = c["seq"].get<long>();
        s.last = &c;
      }
      if (!s.stuck && c["state"] != "done") s.stuck = &c;
    }
  }
  const std::string where = comm == "world" ? "" : " (communicator " + comm + ")";
  // The call the job is held up in: the lowest call number a rank is stuck in.
  long held = -1;
  for (auto& [r, s] : ranks) {
    if (s.stuck && (held < 0 || (*s.stuck)["seq"].get<long>() < held)) {
      held = (*s.stuck)["seq"].get<long>();
    }
  }
  if (held < 0) {
    long last = -1;
    for (auto& [r, s] : ranks) last = std::max(last, s.last_seq);
    out.push_back("no collective in flight" + where + ": every rank that dumped finished its " +
                  "calls (the newest: #" + std::to_string(last) + ")");
  } else {
    std::map<std::string, std::vector<int>> in;  // kind -> ranks stuck in call `held`
    std::vector<int> behind;
    std::set<int> waited_on;
    for (auto& [r, s] : ranks) {
      if (s.stuck && (*s.stuck)["seq"].get<long>() == held) {
        in[(*s.stuck)["kind"].get<std::string>()].push_back(r);
        if (s.stuck->contains("waiting_on")) {
          for (int p : (*s.stuck)["waiting_on"]) waited_on.insert(p);
        }
      } else if (s.last_seq < held) {
        behind.push_back(r);
      }
    }
    std::string kind;  // the kind most ranks are in
    size_t most = 0;
    for (auto& [k, rs] : in) {
      if (rs.size() > most) most = rs.size(), kind = k;
    }
    const std::string call = kind + " #" + std::to_string(held);
    for (int r : behind) {
      const RankState& s = ranks[r];
      out.push_back("rank " + std::to_string(r) + " never entered " + call + where + ", which " +
                    ranks_text(in[kind]) + " wait in" +
                    (s.last ? " (its last call: " + call_text(*s.last) + ", " +
                                  (*s.last)["state"].get<std::string>() + ")"
                            : " (it issued no collective)"));
    }
    for (auto& [k, rs] : in) {
      if (k == kind) continue;
      out.push_back(ranks_text(rs) + (rs.size() == 1 ? " is" : " are") + " in " + k + " #" +
                    std::to_string(held) + " while the others are in " + call + where);
    }
    // A rank that entered the call long after the others (stopped, or busy elsewhere) is late.
    double first = 0;
    for (int r : in[kind]) {
      const double q = (*ranks[r].stuck)["queued"].get<double>();
      if (first == 0 || q < first) first = q;
    }
    std::vector<int> early;
    for (int r : in[kind]) {
      if ((*ranks[r].stuck)["queued"].get<double>() - first < 1.0) early.push_back(r);
    }
    for (int r : in[kind]) {
      const double late = (*ranks[r].stuck)["queued"].get<double>() - first;
      if (late < 1.0) continue;
      char s[64];
      std::snprintf(s, sizeof(s), "%.1f", late);
      out.push_back("rank " + std::to_string(r) + " entered " + call + where + " " + s +
                    " s after " + ranks_text(early) + ": it was stopped, or busy elsewhere");
    }
    for (int r : missing) {
      out.push_back("rank " + std::to_string(r) + " wrote no flight record" + where +
                    ": it died, was stopped, or never failed a call (send it SIGUSR1 while the "
                    "job hangs)");
    }
    // Whom the group waits on from outside it (inside, ranks wait on each other as rings do).
    std::set<int> outside = waited_on;
    for (int r : in[kind]) outside.erase(r);
    if (!outside.empty()) waited_on = outside;
    if (!waited_on.empty()) {
      std::vector<int> w(waited_on.begin(), waited_on.end());
      out.push_back(ranks_text(in[kind]) + " in " + call + where + " wait" +
                    (in[kind].size() == 1 ? "s" : "") + " on " + ranks_text(w));
    }
  }
  for (auto& [r, s] : ranks) {
    out.push_back("rank " + std::to_string(r) + where +
                  " wrote its record on: " + s.dump["reason"].get<std::string>());
  }
  return out;
}

}  // namespace

Run add_doctor(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  app.add_option("dir", *dir, "The COHORT_FLIGHT_DIR the ranks wrote their flight records to")
      ->required();
  return [dir]() -> int {
    std::map<std::string, std::map<int, RankState>> comms;
    if (!fs::is_directory(*dir)) COHORT_THROW(*dir << " is not a directory");
    for (const auto& e : fs::directory_iterator(*dir)) {
      if (e.path().extension() != ".json") continue;
      json d;
      try {
        d = json::parse(std::ifstream(e.path()));
        if (d.value("format", "") != "cohort-flight-1") continue;
        RankState s;
        s.dump = std::move(d);
        const int r = s.dump["rank"].get<int>();
        comms[s.dump["communicator"].get<std::string>()][r] = std::move(s);
      } catch (const std::exception& x) {
        std::printf("%s: not a readable flight record (%s)\n", e.path().c_str(), x.what());
      }
    }
    if (comms.empty()) COHORT_THROW("no flight records (*.rank-N.json) in " << *dir);
    for (auto& [comm, ranks] : comms) {
      for (const std::string& line : diagnose(comm, ranks)) std::printf("%s\n", line.c_str());
    }
    return 0;
  };
}

}  // namespace cohort::cli
