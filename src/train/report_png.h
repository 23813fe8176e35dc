// The PNG copy of a `cohort report` plot: the SVG rendered by librsvg onto a cairo surface. The
// only code that uses librsvg (report_png.cc); without it at configure time the report is SVG
// and HTML only, and says so.
#pragma once

#include <string>

namespace cohort::train::report {

// Whether this build has librsvg; when not, why (for the report to say).
bool png_available();
std::string png_unavailable_reason();

// Renders `svg` at `scale` times its size on white and writes a PNG to `path`; throws naming
// the file and librsvg's or cairo's error.
void svg_to_png(const std::string& svg, const std::string& path, double scale);

}  // namespace cohort::train::report
