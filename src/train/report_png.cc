// PNG copies of the report's plots through librsvg and cairo (see report_png.h). Built with
// COHORT_HAVE_RSVG when CMake found librsvg-2.0; otherwise every call says it is missing.
#include "report_png.h"

#include "cohort/core/error.h"

#ifdef COHORT_HAVE_RSVG
#include <cairo.h>
#include <librsvg/rsvg.h>

#include <cmath>
#endif

namespace cohort::train::report {

#ifdef COHORT_HAVE_RSVG

bool png_available() {
  return true;
}
std::string png_unavailable_reason() {
  return "";
}

void svg_to_png(const std::string& svg, const std::string& path, double scale) {
  GError* error = nullptr;
  RsvgHandle* handle =
      rsvg_handle_new_from_data(reinterpret_cast<const guint8*>(svg.data()), svg.size(), &error);
  if (!handle) {
    const std::string why = error ? error->message : "unknown error";
    if (error) g_error_free(error);
    COHORT_THROW("librsvg cannot read the plot for " << path << ": " << why);
  }
  gdouble w = 0, h = 0;
  if (!rsvg_handle_get_intrinsic_size_in_pixels(handle, &w, &h) || w <= 0 || h <= 0) {
    g_object_unref(handle);
    COHORT_THROW("the plot for " << path << " has no size in pixels (width and height)");
  }
  const int pw = static_cast<int>(std::ceil(w * scale)),
            ph = static_cast<int>(std::ceil(h * scale));
  cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, pw, ph);
  cairo_t* cr = cairo_create(surface);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  const RsvgRectangle viewport{0, 0, static_cast<double>(pw), static_cast<double>(ph)};
  const bool drawn = rsvg_handle_render_document(handle, cr, &viewport, &error);
  std::string why = !drawn && error ? error->message : "";
  if (error) g_error_free(error);
  cairo_destroy(cr);
  g_object_unref(handle);
  cairo_status_t status =
      drawn ? cairo_surface_write_to_png(surface, path.c_str()) : CAIRO_STATUS_SUCCESS;
  cairo_surface_destroy(surface);
  COHORT_CHECK(drawn, "librsvg cannot draw the plot for " << path << ": " << why);
  COHORT_CHECK(status == CAIRO_STATUS_SUCCESS,
               "cannot write " << path << ": " << cairo_status_to_string(status));
}

#else

bool png_available() {
  return false;
}
std::string png_unavailable_reason() {
  return "this cohort was built without librsvg (Debian's librsvg2-dev), so the plots are SVG "
         "only";
}
void svg_to_png(const std::string&, const std::string& path, double) {
  COHORT_THROW("cannot write " << path << ": " << png_unavailable_reason());
}

#endif

}  // namespace cohort::train::report
