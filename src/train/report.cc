// `cohort report`'s page (see cohort/train/report.h): the plots made from the runs' logs, the
// table of runs and the scaling efficiency between them, written as DIR/index.html with each
// plot inline, and each plot as DIR/<name>.svg and DIR/<name>.png.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/train/report.h"
#include "report_png.h"
#include "report_svg.h"

namespace cohort::train {

namespace report {
namespace {

struct Figure {
  std::string id, caption, svg;
};

std::string number(const char* f, double v) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string ranks(int world) {
  return std::to_string(world) + (world == 1 ? " rank" : " ranks");
}

// "ddp", "zero3", "hybrid", ..., or "single" (one rank, no data parallelism).
std::string mode(const RunLog& r) {
  if (r.shard == "none") return r.world > 1 ? "ddp" : "single";
  return r.shard;
}

std::string label(const RunLog& r) {
  return r.name + " (" + ranks(r.world) + ", " + mode(r) + ")";
}

bool has_steps(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

std::string no_validation(const RunLog& r) {
  return r.kind == "cohort bench train"
             ? r.name + ": a bench train log has no validation"
             : r.name + ": no validation in this run (trained without --val)";
}

// `dashed`: each run its own dash pattern too, where runs often coincide (one schedule).
Figure per_step(const std::vector<RunLog>& runs, const std::string& id, const std::string& title,
                const std::string& y_label, std::vector<double> RunLog::*values,
                const std::string& caption, bool dashed = false) {
  LinePlot p;
  p.title = title;
  p.x_label = "step";
  p.x_whole = true;
  p.y_label = y_label;
  p.empty = "No run in these logs has a " + y_label + " per step";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLog& r = runs[i];
    if (!has_steps(r.*values)) {
      p.notes.push_back(r.name + ": no " + y_label + " per step" +
                        (r.kind == "cohort bench train" ? " (a bench train log: synthetic data)"
                                                        : " in this log"));
      continue;
    }
    p.series.push_back({label(r), r.step, r.*values, static_cast<int>(i),
                        dashed ? static_cast<int>(i) : 0, false});
  }
  return {id, caption, draw_lines(p)};
}

Figure accuracy(const std::vector<RunLog>& runs) {
  LinePlot p;
  p.title = "Validation accuracy per epoch";
  p.x_label = "epoch";
  p.x_whole = true;
  p.y_label = "accuracy";
  p.empty = "No run in these logs has validation accuracy";
  p.y_hi = 1;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLog& r = runs[i];
    Series s{label(r), {}, {}, static_cast<int>(i), 0, true};
    bool validated = false;
    for (const RunLog::Epoch& e : r.epochs) {
      if (!e.validated) continue;
      validated = true;
      s.x.push_back(static_cast<double>(e.epoch + 1));
      s.y.push_back(e.val_accuracy);
    }
    if (!validated) {
      p.notes.push_back(no_validation(r));
    } else if (!has_steps(s.y)) {
      p.notes.push_back(r.name + ": no accuracy (multi-label findings: see ROC AUC)");
    } else {
      p.series.push_back(std::move(s));
    }
  }
  return {"val_accuracy", "Accuracy on the validation set after each epoch.", draw_lines(p)};
}

// Per finding (multi-label) or the one binary AUC; colours are findings, dashes are runs.
Figure auc(const std::vector<RunLog>& runs) {
  LinePlot p;
  p.title = "Validation ROC AUC per finding per epoch";
  p.x_label = "epoch";
  p.x_whole = true;
  p.y_label = "ROC AUC";
  p.empty = "No run in these logs has a validation ROC AUC";
  p.y_hi = 1;
  std::map<std::string, int> finding_color;
  bool findings = false;
  for (const RunLog& r : runs)
    for (const RunLog::Epoch& e : r.epochs) findings |= !e.auc_per_finding.empty();
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLog& r = runs[i];
    std::map<std::string, Series> by_finding;
    std::vector<std::string> order;
    bool validated = false;
    for (const RunLog::Epoch& e : r.epochs) {
      if (!e.validated) continue;
      validated = true;
      std::vector<std::pair<std::string, double>> points = e.auc_per_finding;
      if (points.empty()) points.emplace_back("ROC AUC", e.val_auc);
      for (const auto& [name, v] : points) {
        if (!by_finding.count(name)) {
          order.push_back(name);
          if (!finding_color.count(name))
            finding_color[name] = static_cast<int>(finding_color.size());
          const int c = findings ? finding_color[name] : static_cast<int>(i);
          by_finding[name] = Series{findings ? r.name + ": " + name : label(r), {},  {}, c,
                                    findings ? static_cast<int>(i) : 0,         true};
        }
        by_finding[name].x.push_back(static_cast<double>(e.epoch + 1));
        by_finding[name].y.push_back(v);
      }
    }
    if (!validated) {
      p.notes.push_back(no_validation(r));
      continue;
    }
    bool any = false;
    for (const std::string& name : order) {
      if (!has_steps(by_finding[name].y)) continue;
      any = true;
      p.series.push_back(std::move(by_finding[name]));
    }
    if (!any)
      p.notes.push_back(r.name + ": no ROC AUC (it needs two classes or multi-label findings)");
  }
  return {"val_auc",
          findings ? "ROC AUC on the validation set after each epoch, each finding a colour, each "
                     "run a dash pattern."
                   : "ROC AUC on the validation set after each epoch (two classes: one AUC).",
          draw_lines(p)};
}

Figure throughput(const std::vector<RunLog>& runs) {
  LinePlot p;
  p.title = "Images/s per step (all ranks)";
  p.x_label = "step";
  p.x_whole = true;
  p.y_label = "images/s";
  p.empty = "No run in these logs has images/s per step";
  p.y_from_zero = true;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLog& r = runs[i];
    if (!has_steps(r.step_images_per_s)) {
      p.notes.push_back(r.name + ": no images/s per step in this log");
      continue;
    }
    p.series.push_back({label(r) + ": " + number("%.1f", r.images_per_s) + " images/s overall",
                        r.step, r.step_images_per_s, static_cast<int>(i), 0, false});
  }
  return {"images_per_s",
          "Every step's images/s over all ranks (the global batch over rank 0's step time); the "
          "legend gives each run's whole-run figure.",
          draw_lines(p)};
}

Figure breakdown(const std::vector<RunLog>& runs) {
  BarPlot p;
  p.title = "Step breakdown (mean per step, rank 0)";
  p.y_label = "ms per step";
  p.categories = {"compute", "exposed communication", "data wait"};
  p.empty = "No run in these logs has a step breakdown";
  for (const RunLog& r : runs) {
    if (!r.breakdown_note.empty()) p.notes.push_back(r.name + ": " + r.breakdown_note);
    if (!r.has_breakdown) continue;
    p.bars.push_back({"", label(r), {r.compute_ms, r.comm_wait_ms, r.data_wait_ms}, NAN});
  }
  return {"step_breakdown",
          "Where a step's time goes: compute (forward, backward, optimiser), communication the "
          "computation did not hide, and waiting for the input pipeline.",
          draw_bars(p)};
}

Figure memory(const std::vector<RunLog>& runs) {
  BarPlot p;
  p.title = "Memory per rank by category";
  p.y_label = "MiB";
  for (const auto& [key, name] : memory_categories()) p.categories.push_back(name);
  p.marker_label = "peak RSS (the whole process)";
  p.empty = "No run in these logs has memory figures";
  for (const RunLog& r : runs) {
    if (r.memory.empty()) {
      p.notes.push_back(r.name + ": no memory figures in this log");
      continue;
    }
    bool measured = false;
    for (size_t k = 0; k < r.memory.size(); ++k) {
      Bar b{"rank " + std::to_string(k), label(r), {}, r.memory[k].at("peak_rss") / 1048576.0};
      for (const auto& [key, name] : memory_categories()) {
        b.values.push_back(r.memory[k].at(key) / 1048576.0);
        measured |= key == "activations_peak" && r.memory[k].at(key) > 0;
      }
      p.bars.push_back(std::move(b));
    }
    if (!measured)
      p.notes.push_back(r.name + ": no activation figures in this log (the model state only)");
  }
  // The process's peak RSS (code, libraries, the data pipeline's buffers) can dwarf a small
  // model's figures: past twice the tallest bar it is given in a note, not drawn.
  double tallest = 0, rss = 0;
  for (const Bar& b : p.bars) {
    double sum = 0;
    for (double v : b.values) sum += v;
    tallest = std::max(tallest, sum);
    rss = std::max(rss, b.marker);
  }
  if (rss > 2 * tallest) {
    std::string note = "peak RSS of the whole process, off this scale:";
    for (Bar& b : p.bars) {
      note += " " + b.group.substr(0, b.group.find(" (")) + " " + b.label + " " +
              number("%.0f", b.marker) + " MiB;";
      b.marker = NAN;
    }
    note.back() = '.';
    p.notes.push_back(note);
    p.marker_label.clear();
  }
  return {"memory",
          "Each rank's bytes by what holds them (model state, then the peaks of what a step "
          "adds), against the process's peak resident memory.",
          draw_bars(p)};
}

// The scaling efficiency of each run against the one with the fewest ranks: images/s per rank
// over the baseline's images/s per rank.
struct Scaling {
  size_t base = 0;
  std::vector<double> efficiency;
  std::vector<std::string> sentences;
};

Scaling scaling(const std::vector<RunLog>& runs) {
  Scaling s;
  for (size_t i = 1; i < runs.size(); ++i)
    if (runs[i].world < runs[s.base].world) s.base = i;
  const RunLog& b = runs[s.base];
  const double base_per_rank = b.images_per_s / b.world;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLog& r = runs[i];
    const double per_rank = r.images_per_s / r.world;
    s.efficiency.push_back(per_rank / base_per_rank);
    if (i == s.base) continue;
    std::ostringstream o;
    o << r.name << " (" << ranks(r.world) << ", " << mode(r) << ") runs "
      << number("%.1f", r.images_per_s) << " images/s, " << number("%.1f", per_rank)
      << " per rank: a scaling efficiency of " << number("%.1f", 100 * s.efficiency.back())
      << "% against " << b.name << " (" << ranks(b.world) << ", " << mode(b) << ", "
      << number("%.1f", base_per_rank) << " images/s per rank)";
    if (r.world == b.world) o << "; with the same number of ranks, this is their throughput ratio";
    o << ".";
    s.sentences.push_back(o.str());
  }
  if (runs.size() == 1) {
    s.sentences.push_back(
        "One run: no scaling efficiency to state (give several logs, e.g. of 1 "
        "and N ranks, or of ddp and zero3).");
  }
  return s;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) COHORT_THROW("cannot write " << path << ": " << errno_string(errno));
  out << text;
  out.close();
  if (!out) COHORT_THROW("cannot write " << path << ": " << errno_string(errno));
}

std::string page(const std::vector<RunLog>& runs, const Scaling& sc,
                 const std::vector<Figure>& figures, const std::string& png_note) {
  std::ostringstream h;
  std::string names;
  for (const RunLog& r : runs) names += (names.empty() ? "" : ", ") + r.name;
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<title>Cohort report: " << escape_xml(names) << "</title>\n<style>\n"
    << "body { font-family: 'DejaVu Sans', Helvetica, Arial, sans-serif; color: #222; "
       "max-width: 800px; margin: 24px auto; padding: 0 12px; }\n"
    << "h1 { font-size: 24px; } h2 { font-size: 18px; margin-top: 32px; }\n"
    << "table { border-collapse: collapse; font-size: 12px; }\n"
    << "th, td { border-bottom: 1px solid #ddd; padding: 3px 6px; text-align: right; }\n"
    << "th:first-child, td:first-child { text-align: left; }\n"
    << "figure { margin: 24px 0; } figcaption { font-size: 13px; color: #444; }\n"
    << "svg { max-width: 100%; height: auto; border: 1px solid #eee; }\n"
    << ".note { color: #8a4b00; }\n</style>\n</head>\n<body>\n"
    << "<h1>Cohort report</h1>\n<p>" << runs.size() << (runs.size() == 1 ? " run" : " runs") << ": "
    << escape_xml(names) << ".</p>\n";
  h << "<h2>Runs</h2>\n<table>\n<tr><th>run</th><th>log</th><th>model</th><th>ranks</th>"
    << "<th>mode</th><th>precision</th><th>global batch</th><th>steps</th><th>images/s</th>"
    << "<th>per rank</th><th>scaling efficiency</th><th>final loss</th><th>val accuracy</th>"
    << "<th>val ROC AUC</th></tr>\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunLog& r = runs[i];
    double acc = NAN, auc = NAN;
    for (const RunLog::Epoch& e : r.epochs) {
      if (!e.validated) continue;
      acc = e.val_accuracy;
      auc = e.val_auc;
    }
    const double loss = r.loss.empty() ? NAN : r.loss.back();
    h << "<tr><td title=\"" << escape_xml(r.source) << "\">" << escape_xml(r.name) << "</td><td>"
      << escape_xml(r.kind.substr(r.kind.find(' ') + 1)) << "</td><td>" << escape_xml(r.model)
      << "</td><td>" << r.world << "</td><td>" << escape_xml(mode(r)) << "</td><td>"
      << escape_xml(r.precision) << "</td><td>" << r.global_batch << "</td><td>" << r.step.size()
      << "</td><td>" << number("%.1f", r.images_per_s) << "</td><td>"
      << number("%.1f", r.images_per_s / r.world) << "</td><td>"
      << (i == sc.base ? std::string("baseline") : number("%.1f%%", 100 * sc.efficiency[i]))
      << "</td><td>" << number("%.4f", loss) << "</td><td>" << number("%.4f", acc) << "</td><td>"
      << number("%.4f", auc) << "</td></tr>\n";
  }
  h << "</table>\n<h2>Scaling</h2>\n";
  for (const std::string& s : sc.sentences) h << "<p>" << escape_xml(s) << "</p>\n";
  if (runs.size() > 1) {
    h << "<p>Scaling efficiency is images/s per rank relative to the run with the fewest ranks "
         "(1.0: every rank as fast as there).</p>\n";
  }
  h << "<h2>Plots</h2>\n";
  if (!png_note.empty()) h << "<p class=\"note\">" << escape_xml(png_note) << ".</p>\n";
  for (const Figure& f : figures) {
    h << "<figure id=\"" << f.id << "\">\n" << f.svg << "<figcaption>" << escape_xml(f.caption);
    if (png_note.empty()) h << " <a href=\"" << f.id << ".png\">PNG</a>";
    h << " <a href=\"" << f.id << ".svg\">SVG</a></figcaption>\n</figure>\n";
  }
  h << "<p>Written by <code>cohort report</code> from";
  for (const RunLog& r : runs) h << " <code>" << escape_xml(r.source) << "</code>";
  h << ".</p>\n</body>\n</html>\n";
  return h.str();
}

}  // namespace
}  // namespace report

bool report_renders_png() {
  return report::png_available();
}

ReportFiles write_report(std::vector<RunLog> runs, const std::string& dir, bool png) {
  using namespace report;
  if (runs.empty()) COHORT_THROW("cohort report: no run to draw");
  // Names that repeat (run/log.json, other/log.json) are shown as their paths.
  std::map<std::string, int> seen;
  for (const RunLog& r : runs) ++seen[r.name];
  for (RunLog& r : runs)
    if (seen[r.name] > 1) r.name = r.source;
  std::vector<Figure> figures = {
      per_step(runs, "loss", "Training loss per step", "loss", &RunLog::loss,
               "The training loss of every step (rank 0's batch)."),
      per_step(runs, "lr", "Learning rate per step", "learning rate", &RunLog::lr,
               "The learning rate each step used (warmup, then the schedule); each run its own "
               "dash, as runs often share a schedule.",
               true),
      accuracy(runs),
      auc(runs),
      throughput(runs),
      breakdown(runs),
      memory(runs)};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) COHORT_THROW("cannot make the report folder " << dir << ": " << ec.message());
  ReportFiles out;
  out.png_note = !png              ? "PNG copies not asked for"
                 : png_available() ? ""
                                   : png_unavailable_reason();
  for (const Figure& f : figures) {
    const std::string base = (std::filesystem::path(dir) / f.id).string();
    write_text(base + ".svg", f.svg);
    out.svgs.push_back(base + ".svg");
    if (out.png_note.empty()) {
      svg_to_png(f.svg, base + ".png", 2.0);
      out.pngs.push_back(base + ".png");
    }
  }
  out.page = (std::filesystem::path(dir) / "index.html").string();
  write_text(out.page, page(runs, scaling(runs), figures, out.png_note));
  return out;
}

}  // namespace cohort::train
