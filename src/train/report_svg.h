// The plots of `cohort report` as SVG text: line plots (one polyline per series, gaps at NaN)
// and stacked bar plots (one path per bar segment), with axes, ticks, a legend, and notes that
// say what a plot lacks. Data marks are <polyline> and <path> elements; axes, grid and markers
// are <line>s, so a reader (or a test) can tell drawn data from the frame. Internal to
// cohort::train's report; plain SVG 1.1 that browsers and librsvg both draw.
#pragma once

#include <cmath>
#include <string>
#include <vector>

namespace cohort::train::report {

// One line of a line plot: colour and dash index into fixed palettes.
struct Series {
  std::string label;
  std::vector<double> x, y;  // y NaN: a gap
  int color = 0;
  int dash = 0;          // 0 solid, then dashed patterns (one per run where colours are findings)
  bool markers = false;  // a dot at every point (few points: epochs)
};

struct LinePlot {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  std::vector<std::string> notes;  // what the plot lacks, and why
  std::string empty;               // drawn in the middle when no series has a point
  double y_lo = NAN, y_hi = NAN;   // fixed y range (accuracy, AUC); NaN: from the data
  bool y_from_zero = false;
  bool x_whole = false;  // x ticks on whole numbers only (steps, epochs)
};

// A stacked bar: one value per category; `marker` (NaN: none) draws a tick across the bar.
struct Bar {
  std::string label;  // under the bar
  std::string group;  // under a run of bars with the same group
  std::vector<double> values;
  double marker = NAN;
};

struct BarPlot {
  std::string title, y_label;
  std::vector<std::string> categories;  // stacked bottom to top, coloured in order
  std::string marker_label;             // legend entry of the markers ("" if none)
  std::vector<Bar> bars;
  std::vector<std::string> notes;
  std::string empty;
  std::string total_format = "%.1f";  // printf format of the total printed above a bar
};

std::string draw_lines(const LinePlot& p);
std::string draw_bars(const BarPlot& p);

// Text for XML and HTML: & < > " escaped.
std::string escape_xml(const std::string& s);

}  // namespace cohort::train::report
