// `cohort report RUN.json [RUN2.json ...] --out DIR`: the page of one or more runs' logs (the
// plots and the page are cohort::train's report).
#include <cstdio>
#include <memory>

#include "cohort/train/report.h"
#include "verbs.h"

namespace cohort::cli {

Run add_report(CLI::App& app) {
  struct Opts {
    std::vector<std::string> logs;
    std::string out;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("logs", o->logs,
                 "The runs' JSON logs (cohort train --json, cohort bench train --json); several "
                 "share each plot")
      ->required();
  app.add_option("--out", o->out, "Folder for index.html and each plot's SVG and PNG")->required();
  return [o]() -> int {
    std::vector<train::RunLog> runs;
    for (const std::string& path : o->logs) runs.push_back(train::read_run_log(path));
    const train::ReportFiles f = train::write_report(std::move(runs), o->out);
    std::printf("report: %s (%zu plots, %zu PNG copies)\n", f.page.c_str(), f.svgs.size(),
                f.pngs.size());
    if (!f.png_note.empty()) std::printf("report: %s\n", f.png_note.c_str());
    return 0;
  };
}

}  // namespace cohort::cli
