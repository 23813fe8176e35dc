// The plots of `cohort plan --svg DIR`: scaling efficiency against nodes (a line), and the step
// time's breakdown per node count (stacked bars), as self-contained SVG.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "cohort/plan/plan.h"

namespace cohort::plan {

namespace {

constexpr int kW = 640, kH = 400, kLeft = 70, kRight = 20, kTop = 40, kBottom = 50;

struct Canvas {
  std::ostringstream s;
  explicit Canvas(const std::string& title) {
    s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << kW / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">"
      << escape(title) << "</text>\n";
  }
  static std::string escape(const std::string& t) {
    std::string o;
    for (char c : t) {
      if (c == '<') {
        o += "&lt;";
      } else if (c == '>') {
        o += "&gt;";
      } else if (c == '&') {
        o += "&amp;";
      } else {
        o += c;
      }
    }
    return o;
  }
  double x(double i, double n) const {  // slot i of n, centred
    return kLeft + (i + 0.5) * (kW - kLeft - kRight) / n;
  }
  double y(double v, double top) const { return kH - kBottom - v / top * (kH - kTop - kBottom); }
  void axes(const std::vector<Prediction>& rows, double top, const std::string& unit) {
    const int ticks = 5;
    for (int t = 0; t <= ticks; ++t) {
      const double v = top * t / ticks;
      s << "<line x1=\"" << kLeft << "\" x2=\"" << kW - kRight << "\" y1=\"" << y(v, top)
        << "\" y2=\"" << y(v, top) << "\" stroke=\"#ddd\"/>\n"
        << "<text x=\"" << kLeft - 6 << "\" y=\"" << y(v, top) + 4 << "\" text-anchor=\"end\">"
        << std::setprecision(3) << v << "</text>\n";
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      s << "<text x=\"" << x(static_cast<double>(i), static_cast<double>(rows.size())) << "\" y=\""
        << kH - kBottom + 16 << "\" text-anchor=\"middle\">" << rows[i].nodes << "</text>\n";
    }
    s << "<text x=\"" << kW / 2 << "\" y=\"" << kH - 12
      << "\" text-anchor=\"middle\">nodes</text>\n"
      << "<text x=\"16\" y=\"" << kH / 2 << "\" transform=\"rotate(-90 16 " << kH / 2
      << ")\" text-anchor=\"middle\">" << unit << "</text>\n";
  }
  std::string done() {
    s << "</svg>\n";
    return s.str();
  }
};

}  // namespace

std::string efficiency_svg(const std::vector<Prediction>& rows, const std::string& title) {
  Canvas c(title);
  c.axes(rows, 100, "scaling efficiency, %");
  const double n = static_cast<double>(rows.size());
  c.s << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"";
  for (size_t i = 0; i < rows.size(); ++i) {
    c.s << c.x(static_cast<double>(i), n) << "," << c.y(100 * rows[i].efficiency, 100) << " ";
  }
  c.s << "\"/>\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const double px = c.x(static_cast<double>(i), n), py = c.y(100 * rows[i].efficiency, 100);
    c.s << "<circle cx=\"" << px << "\" cy=\"" << py << "\" r=\"3\" fill=\"#1f77b4\"/>\n"
        << "<text x=\"" << px << "\" y=\"" << py - 8 << "\" text-anchor=\"middle\">"
        << static_cast<int>(100 * rows[i].efficiency + 0.5) << "</text>\n";
  }
  return c.done();
}

std::string breakdown_svg(const std::vector<Prediction>& rows, const std::string& title) {
  Canvas c(title);
  double most = 1e-3;
  for (const Prediction& r : rows) most = std::max(most, r.step_ms);
  // The axis ends at the next 1, 2 or 5 times a power of ten above the tallest bar, plus room.
  double top = std::pow(10.0, std::floor(std::log10(most * 1.1)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * top >= most * 1.1) {
      top *= m;
      break;
    }
  }
  c.axes(rows, top, "step time, ms");
  const double n = static_cast<double>(rows.size());
  const double bar = 0.6 * (kW - kLeft - kRight) / n;
  struct Part {
    const char* name;
    const char* colour;
    double Prediction::*ms;
  };
  const Part parts[] = {{"compute", "#1f77b4", &Prediction::compute_ms},
                        {"slowest rank", "#7f7f7f", &Prediction::straggler_ms},
                        {"comm CPU work", "#bcbd22", &Prediction::comm_cpu_ms},
                        {"exposed comm", "#ff7f0e", &Prediction::exposed_comm_ms},
                        {"data wait", "#d62728", &Prediction::data_wait_ms}};
  for (size_t i = 0; i < rows.size(); ++i) {
    double base = 0;
    for (const Part& p : parts) {
      const double v = rows[i].*p.ms;
      if (v <= 0) continue;
      c.s << "<rect x=\"" << c.x(static_cast<double>(i), n) - bar / 2 << "\" y=\""
          << c.y(base + v, top) << "\" width=\"" << bar << "\" height=\""
          << c.y(base, top) - c.y(base + v, top) << "\" fill=\"" << p.colour << "\"/>\n";
      base += v;
    }
  }
  double lx = kLeft + 10;
  for (const Part& p : parts) {
    c.s << "<rect x=\"" << lx << "\" y=\"" << kTop - 8 << "\" width=\"10\" height=\"10\" fill=\""
        << p.colour << "\"/><text x=\"" << lx + 14 << "\" y=\"" << kTop + 1 << "\">" << p.name
        << "</text>\n";
    lx += 40 + 7.0 * static_cast<double>(std::string(p.name).size());
  }
  return c.done();
}

}  // namespace cohort::plan
