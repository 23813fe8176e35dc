// SVG line and stacked bar plots for `cohort report` (see report_svg.h): the frame (axes, ticks,
// grid), the data marks, the legend and the notes, laid out on a fixed 760-pixel width.
#include "report_svg.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace cohort::train::report {

namespace {

constexpr int kWidth = 760;
constexpr double kLeft = 74, kRight = kWidth - 24, kTop = 46, kPlotHeight = 250;
constexpr double kBottom = kTop + kPlotHeight;
constexpr const char* kFont = "DejaVu Sans, Helvetica, Arial, sans-serif";
// Tableau 10: distinct, and readable on white.
constexpr const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
constexpr const char* kDashes[] = {"", "7 4", "2 3", "10 3 2 3"};

const char* color(int i) {
  return kColors[static_cast<size_t>(i) % std::size(kColors)];
}
const char* dash(int i) {
  return kDashes[static_cast<size_t>(i) % std::size(kDashes)];
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A coordinate: one decimal is finer than a pixel.
std::string px(double v) {
  return fmt("%.1f", v);
}

// Roughly how wide text is at 12 px (DejaVu Sans averages 0.58 em).
double text_width(const std::string& s, double size = 12) {
  return 0.58 * size * static_cast<double>(s.size());
}

std::string fit(const std::string& s, double width, double size = 12) {
  const size_t n = static_cast<size_t>(std::max(1.0, width / (0.58 * size)));
  return s.size() <= n ? s : s.substr(0, n > 1 ? n - 1 : 0) + "\u2026";
}

struct Ticks {
  double lo, hi, step;
  int count() const {  // ticks after the first; none where the figures defeat the arithmetic
    const double n = std::round((hi - lo) / step);
    return n >= 0 && n <= 100 ? static_cast<int>(n) : 0;
  }
  double at(int k) const { return lo + k * step; }
};

// About `want` round ticks (1, 2 or 5 times a power of ten) covering [lo, hi].
// The caller has checked that lo, hi and hi - lo are finite.
Ticks nice_ticks(double lo, double hi, int want = 6, double least_step = 0) {
  const double size = std::max(std::abs(lo), std::abs(hi));
  if (!(hi - lo > 1e-9 * size) || !(hi - lo > 1e-200)) {  // one value, or too close to tell apart
    const double pad = size > 1e-200 ? size * 0.1 : 1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / want, mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (raw <= step) break;
  }
  step = std::max(step, least_step);
  const Ticks t{std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step};
  if (std::isfinite(t.lo) && std::isfinite(t.hi) && t.hi > t.lo) return t;
  return {lo, hi, hi - lo};
}

std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-6) v = 0;
  const double a = std::abs(v);
  if (a >= 1e6 || (a > 0 && a < 1e-3)) return fmt("%.3g", v);
  // As many decimals as the step needs.
  const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  char f[16];
  std::snprintf(f, sizeof f, "%%.%df", std::min(decimals, 6));
  return fmt(f, v);
}

class Svg {
 public:
  explicit Svg(const std::string& title) : title_(title) {}
  std::ostringstream& body() { return body_; }
  void text(double x, double y, const std::string& s, const char* anchor = "start", int size = 12,
            const char* extra = "") {
    body_ << "<text x=\"" << px(x) << "\" y=\"" << px(y) << "\" font-size=\"" << size
          << "\" text-anchor=\"" << anchor << "\"" << extra << ">" << escape_xml(s) << "</text>\n";
  }
  void line(double x1, double y1, double x2, double y2, const char* stroke, double width = 1,
            const char* dasharray = "") {
    body_ << "<line x1=\"" << px(x1) << "\" y1=\"" << px(y1) << "\" x2=\"" << px(x2) << "\" y2=\""
          << px(y2) << "\" stroke=\"" << stroke << "\" stroke-width=\"" << width << "\"";
    if (*dasharray) body_ << " stroke-dasharray=\"" << dasharray << "\"";
    body_ << "/>\n";
  }
  std::string finish(double height) const {
    std::ostringstream o;
    o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\""
      << static_cast<int>(std::ceil(height)) << "\" viewBox=\"0 0 " << kWidth << " "
      << static_cast<int>(std::ceil(height)) << "\" font-family=\"" << kFont << "\">\n"
      << "<title>" << escape_xml(title_) << "</title>\n"
      << "<rect x=\"0\" y=\"0\" width=\"" << kWidth << "\" height=\""
      << static_cast<int>(std::ceil(height)) << "\" fill=\"#ffffff\"/>\n"
      << "<text x=\"" << kLeft << "\" y=\"26\" font-size=\"16\" font-weight=\"bold\">"
      << escape_xml(title_) << "</text>\n"
      << body_.str() << "</svg>\n";
    return o.str();
  }

 private:
  std::string title_;
  std::ostringstream body_;
};

// The y axis: grid lines, tick labels and the axis title; returns the value-to-pixel map.
struct YAxis {
  Ticks t;
  double to_px(double v) const { return kBottom - (v - t.lo) / (t.hi - t.lo) * kPlotHeight; }
};

YAxis draw_y_axis(Svg& svg, double lo, double hi, const std::string& label) {
  YAxis a{nice_ticks(lo, hi, 5)};
  for (int k = 0; k <= a.t.count(); ++k) {
    const double v = a.t.at(k);
    const double y = a.to_px(v);
    svg.line(kLeft, y, kRight, y, "#e6e6e6");
    svg.text(kLeft - 6, y + 4, tick_label(v, a.t.step), "end", 11);
  }
  svg.line(kLeft, kTop, kLeft, kBottom, "#333333");
  svg.line(kLeft, kBottom, kRight, kBottom, "#333333");
  const std::string rot = " transform=\"rotate(-90 16 " + px((kTop + kBottom) / 2) + ")\"";
  svg.text(16, (kTop + kBottom) / 2, label, "middle", 12, rot.c_str());
  return a;
}

// Legend entries in rows under the plot, from y; returns the y below them.
struct LegendEntry {
  std::string label;
  int color;
  int dash;
  bool box;     // a filled box (bars) or a line sample (series)
  bool marker;  // a black tick (bar markers)
};

double draw_legend(Svg& svg, const std::vector<LegendEntry>& entries, double y) {
  double x = kLeft;
  const double row = 18;
  if (!entries.empty()) y += row;
  for (const LegendEntry& e : entries) {
    const std::string label = fit(e.label, kRight - kLeft - 40);
    const double w = 34 + text_width(label);
    if (x > kLeft && x + w > kRight) {
      x = kLeft;
      y += row;
    }
    if (e.marker) {
      svg.line(x, y - 4, x + 22, y - 4, "#000000", 2);
    } else if (e.box) {
      svg.body() << "<rect x=\"" << px(x + 5) << "\" y=\"" << px(y - 10) << "\" width=\"12\" "
                 << "height=\"12\" fill=\"" << color(e.color) << "\"/>\n";
    } else {
      svg.line(x, y - 4, x + 22, y - 4, color(e.color), 2.5, dash(e.dash));
    }
    svg.text(x + 28, y, label);
    x += w + 14;
  }
  return y;
}

// Notes in brown under the legend, wrapped at words to the plot's width; returns the y below.
double draw_notes(Svg& svg, const std::vector<std::string>& notes, double y) {
  const size_t width = static_cast<size_t>((kRight - kLeft) / (0.58 * 11));
  for (const std::string& n : notes) {
    std::string rest = n;
    while (!rest.empty()) {
      size_t cut = rest.size();
      if (cut > width) {
        cut = rest.rfind(' ', width);
        if (cut == std::string::npos || cut == 0) cut = width;
      }
      y += 16;
      svg.text(kLeft, y, rest.substr(0, cut), "start", 11, " fill=\"#8a4b00\"");
      rest = rest.substr(std::min(rest.size(), cut + (cut < rest.size() && rest[cut] == ' ')));
    }
  }
  return y;
}

struct Point {
  double x, y;
};

// A long run of points (a long training's steps) kept to what a pixel column shows: in each
// column its first and last points and its highest and lowest, in their order, so that the
// line's envelope and its spikes stay while the file stays small. Short runs pass unchanged.
std::vector<Point> envelope(const std::vector<Point>& run) {
  if (run.size() <= 2 * static_cast<size_t>(kRight - kLeft)) return run;
  std::vector<Point> out;
  size_t begin = 0;
  while (begin < run.size()) {
    size_t end = begin, lo = begin, hi = begin;
    const double column = std::floor(run[begin].x);
    for (; end < run.size() && std::floor(run[end].x) == column; ++end) {
      if (run[end].y < run[lo].y) lo = end;
      if (run[end].y > run[hi].y) hi = end;
    }
    size_t keep[4] = {begin, lo, hi, end - 1};
    std::sort(std::begin(keep), std::end(keep));
    for (size_t k = 0; k < 4; ++k)
      if (k == 0 || keep[k] != keep[k - 1]) out.push_back(run[keep[k]]);
    begin = end;
  }
  return out;
}

void draw_empty(Svg& svg, const std::string& message) {
  svg.body() << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kRight - kLeft
             << "\" height=\"" << kPlotHeight << "\" fill=\"#f7f7f7\" stroke=\"#cccccc\"/>\n";
  svg.text((kLeft + kRight) / 2, (kTop + kBottom) / 2, message, "middle", 14, " fill=\"#8a4b00\"");
}

}  // namespace

std::string escape_xml(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:  // XML has no place for control characters (a name in a log may hold them)
        o += static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' ? '?' : c;
    }
  }
  return o;
}

std::string draw_lines(const LinePlot& p) {
  Svg svg(p.title);
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (const Series& s : p.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      xlo = std::min(xlo, s.x[i]);
      xhi = std::max(xhi, s.x[i]);
      ylo = std::min(ylo, s.y[i]);
      yhi = std::max(yhi, s.y[i]);
    }
  }
  double y = kBottom + 34;
  if (!(xlo <= xhi)) {
    draw_empty(svg, p.empty.empty() ? "No data in these logs" : p.empty);
    y = kBottom + 4;
  } else if (!std::isfinite(xhi - xlo) || !std::isfinite(yhi - ylo)) {
    draw_empty(svg, "The figures span more than a double holds: nothing to draw");
    y = kBottom + 4;
  } else {
    if (std::isfinite(p.y_lo)) ylo = std::min(ylo, p.y_lo);
    if (std::isfinite(p.y_hi)) yhi = std::max(yhi, p.y_hi);
    if (p.y_from_zero) ylo = std::min(ylo, 0.0);
    const YAxis ya = draw_y_axis(svg, ylo, yhi, p.y_label);
    const Ticks xt = nice_ticks(xlo, xhi, 8, p.x_whole ? 1 : 0);
    auto xpx = [&](double v) { return kLeft + (v - xt.lo) / (xt.hi - xt.lo) * (kRight - kLeft); };
    for (int k = 0; k <= xt.count(); ++k) {
      const double v = xt.at(k);
      svg.line(xpx(v), kBottom, xpx(v), kBottom + 4, "#333333");
      svg.text(xpx(v), kBottom + 17, tick_label(v, xt.step), "middle", 11);
    }
    svg.text((kLeft + kRight) / 2, kBottom + 34, p.x_label, "middle");
    for (const Series& s : p.series) {
      // One polyline per run of finite points; a lone point shows as its marker.
      std::vector<Point> run;
      auto flush = [&] {
        if (run.size() >= 2) {
          svg.body() << "<polyline class=\"series\" fill=\"none\" stroke=\"" << color(s.color)
                     << "\" stroke-width=\"1.8\" stroke-linejoin=\"round\"";
          if (*dash(s.dash)) svg.body() << " stroke-dasharray=\"" << dash(s.dash) << "\"";
          svg.body() << " points=\"";
          const std::vector<Point> drawn = envelope(run);
          for (size_t i = 0; i < drawn.size(); ++i)
            svg.body() << (i ? " " : "") << px(drawn[i].x) << "," << px(drawn[i].y);
          svg.body() << "\"/>\n";
        }
        run.clear();
      };
      for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
        if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
          flush();
          continue;
        }
        run.push_back({xpx(s.x[i]), ya.to_px(s.y[i])});
      }
      flush();
      if (s.markers) {
        for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
          if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
          // A closed path, not a <circle>: a marker is data as much as the line is.
          const double cx = xpx(s.x[i]), cy = ya.to_px(s.y[i]);
          svg.body() << "<path class=\"point\" fill=\"" << color(s.color) << "\" d=\"M"
                     << px(cx - 3.5) << " " << px(cy)
                     << "a3.5 3.5 0 1 0 7 0a3.5 3.5 0 1 0 -7 0z\"/>\n";
        }
      }
    }
    y += 8;
  }
  std::vector<LegendEntry> legend;
  for (const Series& s : p.series) legend.push_back({s.label, s.color, s.dash, false, false});
  y = draw_legend(svg, legend, y);
  y = draw_notes(svg, p.notes, y);
  return svg.finish(y + 14);
}

std::string draw_bars(const BarPlot& p) {
  Svg svg(p.title);
  double hi = 0;
  for (const Bar& b : p.bars) {
    double sum = 0;
    for (double v : b.values) sum += std::isfinite(v) ? v : 0;
    hi = std::max({hi, sum, std::isfinite(b.marker) ? b.marker : 0.0});
  }
  double y = kBottom + 40;
  if (p.bars.empty() || !(hi > 0)) {
    draw_empty(svg, p.empty.empty() ? "No data in these logs" : p.empty);
    y = kBottom + 4;
  } else if (!std::isfinite(hi * 1.08)) {
    draw_empty(svg, "The figures are more than a double holds: nothing to draw");
    y = kBottom + 4;
  } else {
    const YAxis ya = draw_y_axis(svg, 0, hi * 1.08, p.y_label);
    // Bars of a group side by side; a gap of one bar between groups.
    size_t groups = 0;
    for (size_t i = 0; i < p.bars.size(); ++i)
      groups += i == 0 || p.bars[i].group != p.bars[i - 1].group;
    const double slots = static_cast<double>(p.bars.size() + groups) - 0.5;
    const double slot = (kRight - kLeft) / slots, width = std::min(slot * 0.8, 90.0);
    double x = kLeft + slot * 0.25;
    double group_x0 = x;
    for (size_t i = 0; i < p.bars.size(); ++i) {
      const Bar& b = p.bars[i];
      if (i > 0 && b.group != p.bars[i - 1].group) x += slot;
      if (i == 0 || b.group != p.bars[i - 1].group) group_x0 = x;
      const double cx = x + slot / 2;
      double base = 0;
      for (size_t k = 0; k < b.values.size(); ++k) {
        const double v = std::isfinite(b.values[k]) ? b.values[k] : 0;
        if (v <= 0) continue;
        const double y0 = ya.to_px(base), y1 = ya.to_px(base + v);
        svg.body() << "<path class=\"bar\" fill=\"" << color(static_cast<int>(k)) << "\" d=\"M"
                   << px(cx - width / 2) << " " << px(y0) << "H" << px(cx + width / 2) << "V"
                   << px(y1) << "H" << px(cx - width / 2) << "Z\"><title>"
                   << escape_xml(b.group + " " + b.label + ": " + p.categories[k] + " " +
                                 fmt(p.total_format.c_str(), v))
                   << "</title></path>\n";
        base += v;
      }
      if (std::isfinite(b.marker)) {
        const double my = ya.to_px(b.marker);
        svg.line(cx - width / 2 - 4, my, cx + width / 2 + 4, my, "#000000", 2);
      }
      svg.text(cx, ya.to_px(base) - 5, fmt(p.total_format.c_str(), base), "middle", 10);
      if (!b.label.empty()) svg.text(cx, kBottom + 15, fit(b.label, slot, 11), "middle", 11);
      x += slot;
      const bool last = i + 1 == p.bars.size() || p.bars[i + 1].group != b.group;
      if (last) {
        const double gy = b.label.empty() ? kBottom + 16 : kBottom + 31;
        svg.text((group_x0 + x) / 2, gy, fit(b.group, x - group_x0 + slot * 0.8), "middle", 12,
                 " font-weight=\"bold\"");
      }
    }
  }
  std::vector<LegendEntry> legend;
  for (size_t k = 0; k < p.categories.size(); ++k)
    legend.push_back({p.categories[k], static_cast<int>(k), 0, true, false});
  if (!p.marker_label.empty()) legend.push_back({p.marker_label, 0, 0, false, true});
  y = draw_legend(svg, legend, y);
  y = draw_notes(svg, p.notes, y);
  return svg.finish(y + 14);
}

}  // namespace cohort::train::report
