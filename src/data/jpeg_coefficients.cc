// The CPU half of the mixed JPEG decoder (see jpeg_coefficients.h): libjpeg-turbo's
// jpeg_read_coefficients, and the host run of the device's arithmetic.
#include "cohort/data/jpeg_coefficients.h"

#include <jpeglib.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

#include "kernels/jpeg_math.h"

namespace cohort::data {

namespace {

// libjpeg reports errors by longjmp: read_coefficients keeps no C++ object in its frame.
struct CoefError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void coef_fail(j_common_ptr c) {
  auto* e = reinterpret_cast<CoefError*>(c->err);
  (*c->err->format_message)(c, e->message);
  longjmp(e->jump, 1);
}

// Warnings (corrupt data, a truncated file) are errors, as in the CPU decoder.
void coef_message(j_common_ptr c, int level) {
  if (level < 0) coef_fail(c);
}

struct CoefState {
  jpeg_decompress_struct cinfo;
  CoefError err;
  bool created;
};

// 1: read into `out`; 0: libjpeg error (message in s->err); 2: a layout the device path does not
// take (reason in `why`, at most 200 bytes).
int read_coefficients(CoefState* s, const uint8_t* data, size_t size, JpegCoefficients* out,
                      char* why) {
  s->cinfo.err = jpeg_std_error(&s->err.mgr);
  s->err.mgr.error_exit = coef_fail;
  s->err.mgr.emit_message = coef_message;
  if (setjmp(s->err.jump)) return 0;
  jpeg_create_decompress(&s->cinfo);
  s->created = true;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s->cinfo, TRUE);
  jpeg_decompress_struct& ci = s->cinfo;
  const int n = ci.num_components;
  if (ci.data_precision != 8 || ci.arith_code) {
    std::snprintf(why, 200, "%s", ci.arith_code ? "arithmetic-coded" : "not 8-bit");
    return 2;
  }
  if (!((n == 1 && ci.jpeg_color_space == JCS_GRAYSCALE) ||
        (n == 3 && ci.jpeg_color_space == JCS_YCbCr))) {
    std::snprintf(why, 200, "colour space %d with %d components", int(ci.jpeg_color_space), n);
    return 2;
  }
  const int hmax = ci.max_h_samp_factor, vmax = ci.max_v_samp_factor;
  for (int c = 0; c < n; ++c) {
    const jpeg_component_info& k = ci.comp_info[c];
    const int h = hmax / k.h_samp_factor, v = vmax / k.v_samp_factor;
    const bool ok = hmax % k.h_samp_factor == 0 && vmax % k.v_samp_factor == 0 &&
                    (c == 0 ? h == 1 && v == 1 : (h == 1 && v == 1) || (h == 2 && v <= 2));
    if (!ok) {
      std::snprintf(why, 200, "sampling %dx%d in component %d of %dx%d", k.h_samp_factor,
                    k.v_samp_factor, c, hmax, vmax);
      return 2;
    }
  }
  jvirt_barray_ptr* arrays = jpeg_read_coefficients(&ci);
  out->width = static_cast<int>(ci.image_width);
  out->height = static_cast<int>(ci.image_height);
  out->components.resize(n);
  for (int c = 0; c < n; ++c) {
    jpeg_component_info& k = ci.comp_info[c];
    JpegComponent& o = out->components[c];
    o.h = hmax / k.h_samp_factor;
    o.v = vmax / k.v_samp_factor;
    o.width = (out->width + o.h - 1) / o.h;
    o.height = (out->height + o.v - 1) / o.v;
    o.blocks_w = static_cast<int>(k.width_in_blocks);
    o.blocks_h = static_cast<int>(k.height_in_blocks);
    for (int i = 0; i < 64; ++i) o.quant[i] = k.quant_table->quantval[i];
    o.coef.resize(size_t(o.blocks_w) * o.blocks_h * 64);
    for (int by = 0; by < o.blocks_h; ++by) {
      JBLOCKARRAY row = (*ci.mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(&ci),
                                                      arrays[c], by, 1, FALSE);
      std::memcpy(o.coef.data() + size_t(by) * o.blocks_w * 64, row[0],
                  size_t(o.blocks_w) * sizeof(JBLOCK));
    }
  }
  jpeg_finish_decompress(&ci);
  return 1;
}

}  // namespace

bool read_jpeg_coefficients(std::span<const uint8_t> bytes, const std::string& name,
                            JpegCoefficients* out, std::string* why_not) {
  auto s = std::make_unique<CoefState>();
  s->created = false;
  char why[200] = {0};
  const int r = read_coefficients(s.get(), bytes.data(), bytes.size(), out, why);
  if (s->created) jpeg_destroy_decompress(&s->cinfo);
  if (r == 0) COHORT_THROW_AS(DecodeError, name << ": JPEG decode failed: " << s->err.message);
  if (r == 2) {
    if (why_not) *why_not = why;
    return false;
  }
  return true;
}

Image decode_coefficients_on_host(const JpegCoefficients& c) {
  // Each component's blocks through the IDCT into a padded plane, as the device does.
  std::vector<std::vector<uint8_t>> planes(c.components.size());
  std::vector<kernels::Plane> views(c.components.size());
  for (size_t k = 0; k < c.components.size(); ++k) {
    const JpegComponent& comp = c.components[k];
    const int stride = comp.blocks_w * 8;
    planes[k].resize(size_t(stride) * comp.blocks_h * 8);
    for (int by = 0; by < comp.blocks_h; ++by)
      for (int bx = 0; bx < comp.blocks_w; ++bx)
        kernels::idct_block(comp.coef.data() + (size_t(by) * comp.blocks_w + bx) * 64,
                            comp.quant.data(), planes[k].data() + size_t(by) * 8 * stride + bx * 8,
                            stride);
    views[k] = kernels::Plane{planes[k].data(), comp.width, comp.height, stride};
  }
  Image img;
  img.width = c.width;
  img.height = c.height;
  img.channels = c.components.size() == 1 ? 1 : 3;
  img.data.resize(img.row_bytes() * img.height);
  for (int y = 0; y < c.height; ++y) {
    uint8_t* row = img.data.data() + size_t(y) * img.row_bytes();
    for (int x = 0; x < c.width; ++x) {
      if (img.channels == 1) {
        row[x] = static_cast<uint8_t>(views[0].at(x, y));
        continue;
      }
      const JpegComponent &cb = c.components[1], &cr = c.components[2];
      kernels::ycc_to_rgb(views[0].at(x, y), kernels::upsample(views[1], x, y, cb.h, cb.v),
                          kernels::upsample(views[2], x, y, cr.h, cr.v), row + 3 * x);
    }
  }
  return img;
}

}  // namespace cohort::data
