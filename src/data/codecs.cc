#include <spng.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

// clang-format off
#include <jpeglib.h>  // after <cstdio>: it needs FILE
// clang-format on

#include "cohort/data/dicom.h"
#include "cohort/data/image.h"

namespace cohort::data {

namespace {

struct TjHandle {
  tjhandle h;
  explicit TjHandle(bool compress) : h(compress ? tjInitCompress() : tjInitDecompress()) {
    if (!h) COHORT_THROW("libjpeg-turbo: cannot create a handle");
  }
  ~TjHandle() { tjDestroy(h); }
};

tjhandle decompressor() {
  thread_local TjHandle t(false);  // one per thread: handles are not thread-safe
  return t.h;
}

struct SpngCtx {
  spng_ctx* ctx;
  explicit SpngCtx(int flags) : ctx(spng_ctx_new(flags)) {
    if (!ctx) COHORT_THROW("libspng: out of memory");
  }
  ~SpngCtx() { spng_ctx_free(ctx); }
};

}  // namespace

Format sniff(const uint8_t* p, size_t n) {
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return Format::jpeg;
  static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (n >= 8 && std::memcmp(p, png_sig, 8) == 0) return Format::png;
  if (n >= 132 && std::memcmp(p + 128, "DICM", 4) == 0) return Format::dicom;
  return Format::unknown;
}

ImageInfo probe(std::span<const uint8_t> bytes, const std::string& name) {
  ImageInfo info;
  info.format = sniff(bytes.data(), bytes.size());
  if (info.format == Format::jpeg) {
    int w = 0, h = 0, sub = 0, cs = 0;
    if (tjDecompressHeader3(decompressor(), bytes.data(), bytes.size(), &w, &h, &sub, &cs) != 0) {
      COHORT_THROW_AS(DecodeError,
                      name << ": not a readable JPEG: " << tjGetErrorStr2(decompressor()));
    }
    info.width = w;
    info.height = h;
    info.channels = cs == TJCS_GRAY ? 1 : 3;
  } else if (info.format == Format::png) {
    SpngCtx c(0);
    spng_set_png_buffer(c.ctx, bytes.data(), bytes.size());
    spng_ihdr ihdr{};
    if (int rc = spng_get_ihdr(c.ctx, &ihdr)) {
      COHORT_THROW_AS(DecodeError, name << ": not a readable PNG: " << spng_strerror(rc));
    }
    info.width = static_cast<int>(ihdr.width);
    info.height = static_cast<int>(ihdr.height);
    info.channels = (ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE ||
                     ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA)
                        ? 1
                        : 3;
  } else if (info.format == Format::dicom) {
    info = probe_dicom(bytes, name);
  } else {
    COHORT_THROW_AS(DecodeError, name << ": unknown image format (" << bytes.size() << " bytes)");
  }
  // A header may declare any size: a few bytes of PNG asked fuzz_image for a 6 GB buffer. No
  // image of this project's inputs (scans up to a few thousand pixels a side, 16 bits) comes
  // near 1 GiB decoded; a larger one is refused before anything is allocated for it.
  const double decoded = static_cast<double>(info.width) * info.height * info.channels * 2;
  if (decoded > static_cast<double>(kMaxDecodedBytes)) {
    COHORT_THROW_AS(DecodeError, name << ": declares " << info.width << "x" << info.height
                                      << " pixels, " << decoded / (1 << 20)
                                      << " MiB decoded: more than the "
                                      << kMaxDecodedBytes / (1 << 20) << " MiB an image may take");
  }
  return info;
}

// ---------------------------------------------------------------------------------------------
// JPEG regions, through libjpeg's API (TurboJPEG 2 has no cropping). libjpeg reports errors by
// longjmp: the phases that call it keep no C++ object in their frames, and the state they share
// lives in a plain struct the caller owns.

namespace {

struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegError*>(c->err);
  (*c->err->format_message)(c, e->message);
  longjmp(e->jump, 1);
}

// Warnings (corrupt data, a truncated file) are errors, as for the whole decode: a partly grey
// crop would train the model on garbage.
void jpeg_message(j_common_ptr c, int level) {
  if (level < 0) jpeg_fail(c);
}

struct JpegRegionState {
  jpeg_decompress_struct cinfo;
  JpegError err;
  bool created;
};

// Reads the header and starts decompression of the scaled image cut to `region` (the image's own
// pixels: x0, y0, x1, y1) and a margin; `got` receives the part kept, in scaled pixels (x0,
// width, y0, height), and the output's channels.
// Returns 1 on success, 0 on a libjpeg error (message in err), 2 when the colour space needs the
// whole-image path.
int jpeg_region_begin(JpegRegionState* s, const uint8_t* data, size_t size, int scale, int fast,
                      const double* region, int* got) {
  s->cinfo.err = jpeg_std_error(&s->err.mgr);
  s->err.mgr.error_exit = jpeg_fail;
  s->err.mgr.emit_message = jpeg_message;
  if (setjmp(s->err.jump)) return 0;
  jpeg_create_decompress(&s->cinfo);
  s->created = true;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s->cinfo, TRUE);
  const J_COLOR_SPACE cs = s->cinfo.jpeg_color_space;
  if (cs != JCS_GRAYSCALE && cs != JCS_YCbCr && cs != JCS_RGB) return 2;
  s->cinfo.out_color_space = cs == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
  s->cinfo.scale_num = static_cast<unsigned>(scale);
  s->cinfo.scale_denom = 8;
  s->cinfo.dct_method = fast ? JDCT_IFAST : JDCT_ISLOW;
  jpeg_start_decompress(&s->cinfo);
  const double sx = static_cast<double>(s->cinfo.output_width) / s->cinfo.image_width;
  const double sy = static_cast<double>(s->cinfo.output_height) / s->cinfo.image_height;
  const int ow = static_cast<int>(s->cinfo.output_width);
  const int oh = static_cast<int>(s->cinfo.output_height);
  // A margin of one MCU (16 pixels) around the region: fancy upsampling of subsampled chroma
  // restarts at a cut, so the rows and columns next to one differ from the whole decode.
  constexpr int kMargin = 16;
  int x0 = static_cast<int>(region[0] * sx) - kMargin,
      y0 = static_cast<int>(region[1] * sy) - kMargin;
  int x1 = static_cast<int>(region[2] * sx + 0.999999) + kMargin,
      y1 = static_cast<int>(region[3] * sy + 0.999999) + kMargin;
  x0 = x0 < 0 ? 0 : (x0 >= ow ? ow - 1 : x0);
  y0 = y0 < 0 ? 0 : (y0 >= oh ? oh - 1 : y0);
  x1 = x1 <= x0 ? x0 + 1 : (x1 > ow ? ow : x1);
  y1 = y1 <= y0 ? y0 + 1 : (y1 > oh ? oh : y1);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), width = static_cast<JDIMENSION>(x1 - x0);
  if (width < static_cast<JDIMENSION>(ow)) jpeg_crop_scanline(&s->cinfo, &xoff, &width);
  if (y0 > 0) jpeg_skip_scanlines(&s->cinfo, static_cast<JDIMENSION>(y0));
  got[0] = static_cast<int>(xoff);
  got[1] = static_cast<int>(s->cinfo.output_width);
  got[2] = y0;
  got[3] = y1 - y0;
  got[4] = s->cinfo.output_components;
  return 1;
}

// Reads `rows` rows into dst; 1 on success, 0 on a libjpeg error.
int jpeg_region_read(JpegRegionState* s, uint8_t* dst, size_t row_bytes, int rows) {
  if (setjmp(s->err.jump)) return 0;
  for (int r = 0; r < rows; ++r) {
    JSAMPROW row = dst + static_cast<size_t>(r) * row_bytes;
    if (jpeg_read_scanlines(&s->cinfo, &row, 1) != 1) return 0;
  }
  return 1;
}

}  // namespace

Image decode_jpeg_region(std::span<const uint8_t> bytes, const std::string& name, int scale_eighths,
                         Idct idct, PixelRegion region, PixelRegion* origin) {
  auto s = std::make_unique<JpegRegionState>();
  std::memset(s.get(), 0, sizeof(JpegRegionState));
  struct Destroy {
    JpegRegionState* s;
    ~Destroy() {
      if (s->created) jpeg_destroy_decompress(&s->cinfo);
    }
  } destroy{s.get()};
  const double want[4] = {static_cast<double>(region.x), static_cast<double>(region.y),
                          static_cast<double>(region.x) + region.w,
                          static_cast<double>(region.y) + region.h};
  int got[5] = {0, 0, 0, 0, 0};
  const int begun = jpeg_region_begin(s.get(), bytes.data(), bytes.size(), scale_eighths,
                                      idct == Idct::fast, want, got);
  if (begun == 0) {
    s->err.message[JMSG_LENGTH_MAX - 1] = 0;
    COHORT_THROW_AS(DecodeError, name << ": JPEG decode failed: " << s->err.message);
  }
  if (begun == 2) {
    Image whole = decode(bytes, name, scale_eighths, idct);
    *origin = PixelRegion{0, 0, whole.width, whole.height};
    return whole;
  }
  Image img;
  img.width = got[1];
  img.height = got[3];
  img.channels = got[4];
  img.bits = 8;
  img.data.resize(img.row_bytes() * static_cast<size_t>(img.height));
  if (!jpeg_region_read(s.get(), img.data.data(), img.row_bytes(), img.height)) {
    s->err.message[JMSG_LENGTH_MAX - 1] = 0;
    COHORT_THROW_AS(DecodeError, name << ": JPEG decode failed: " << s->err.message);
  }
  *origin = PixelRegion{got[0], got[2], img.width, img.height};
  return img;
}

int jpeg_scale_for(int region_w, int region_h, int min_side) {
  if (min_side <= 0) return 8;
  for (int e = 1; e <= 8; ++e) {  // smallest image (most downscaled) that is still large enough
    if ((region_w * e) / 8 >= min_side && (region_h * e) / 8 >= min_side) return e;
  }
  return 8;
}

Image decode(std::span<const uint8_t> bytes, const std::string& name, int scale_eighths,
             Idct idct) {
  if (sniff(bytes.data(), bytes.size()) == Format::dicom) return decode_dicom(bytes, name);
  ImageInfo info = probe(bytes, name);
  Image img;
  if (info.format == Format::jpeg) {
    tjscalingfactor f{scale_eighths, 8};
    img.width = TJSCALED(info.width, f);
    img.height = TJSCALED(info.height, f);
    img.channels = info.channels;
    img.bits = 8;
    img.data.resize(img.row_bytes() * img.height);
    int pf = img.channels == 1 ? TJPF_GRAY : TJPF_RGB;
    if (tjDecompress2(decompressor(), bytes.data(), bytes.size(), img.data.data(), img.width, 0,
                      img.height, pf,
                      idct == Idct::fast ? TJFLAG_FASTDCT : TJFLAG_ACCURATEDCT) != 0) {
      // Warnings (such as a truncated file with a partial image) are errors here: a partly
      // grey image would train the model on garbage.
      COHORT_THROW_AS(DecodeError,
                      name << ": JPEG decode failed: " << tjGetErrorStr2(decompressor()));
    }
    return img;
  }
  SpngCtx c(0);
  spng_set_png_buffer(c.ctx, bytes.data(), bytes.size());
  spng_ihdr ihdr{};
  spng_get_ihdr(c.ctx, &ihdr);
  const bool gray = info.channels == 1;
  const bool sixteen = ihdr.bit_depth == 16;
  // libspng has no 16-bit gray output format; the PNG's own format is host-endian too.
  int fmt =
      gray ? (sixteen ? SPNG_FMT_PNG : SPNG_FMT_G8) : (sixteen ? SPNG_FMT_RGBA16 : SPNG_FMT_RGB8);
  if (gray && ihdr.color_type != SPNG_COLOR_TYPE_GRAYSCALE)
    fmt = sixteen ? SPNG_FMT_GA16 : SPNG_FMT_GA8;
  if (gray && ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && !sixteen && ihdr.bit_depth < 8) {
    fmt = SPNG_FMT_G8;
  }
  size_t out_size = 0;
  if (int rc = spng_decoded_image_size(c.ctx, fmt, &out_size)) {
    COHORT_THROW_AS(DecodeError, name << ": PNG: " << spng_strerror(rc));
  }
  // libspng's buffer (RGBA for 16-bit colour, gray with alpha) and, where alpha is dropped, the
  // image both count against the cap, so that no decode holds more than it at once.
  const size_t final_bytes =
      static_cast<size_t>(info.width) * info.height * info.channels * (sixteen ? 2 : 1);
  const size_t peak = out_size + (out_size != final_bytes ? final_bytes : 0);
  if (peak > kMaxDecodedBytes) {
    COHORT_THROW_AS(DecodeError, name << ": PNG of " << info.width << "x" << info.height
                                      << " pixels takes " << (peak >> 20)
                                      << " MiB to decode: more than the "
                                      << (kMaxDecodedBytes >> 20) << " MiB an image may take");
  }
  std::vector<uint8_t> raw(out_size);
  if (int rc = spng_decode_image(c.ctx, raw.data(), raw.size(), fmt, 0)) {
    COHORT_THROW_AS(DecodeError, name << ": PNG decode failed: " << spng_strerror(rc));
  }
  img.width = info.width;
  img.height = info.height;
  img.channels = info.channels;
  img.bits = sixteen ? 16 : 8;
  const size_t px = static_cast<size_t>(img.width) * img.height;
  const size_t bps = sixteen ? 2 : 1;
  const size_t in_ch = out_size / (px * bps);
  if (in_ch == static_cast<size_t>(img.channels)) {
    img.data = std::move(raw);
  } else {  // drop alpha
    img.data.resize(px * img.channels * bps);
    for (size_t i = 0; i < px; ++i) {
      std::memcpy(&img.data[i * img.channels * bps], &raw[i * in_ch * bps], img.channels * bps);
    }
  }
  return img;
}

std::vector<uint8_t> encode_png(const Image& img) {
  SpngCtx c(SPNG_CTX_ENCODER);
  spng_set_option(c.ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(img.width);
  ihdr.height = static_cast<uint32_t>(img.height);
  ihdr.bit_depth = static_cast<uint8_t>(img.bits);
  ihdr.color_type = img.channels == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(c.ctx, &ihdr);
  // libspng takes 16-bit samples in host byte order and writes them big-endian.
  if (int rc = spng_encode_image(c.ctx, img.data.data(), img.data.size(), SPNG_FMT_PNG,
                                 SPNG_ENCODE_FINALIZE)) {
    COHORT_THROW("PNG encode failed: " << spng_strerror(rc));
  }
  size_t len = 0;
  int err = 0;
  void* buf = spng_get_png_buffer(c.ctx, &len, &err);
  if (!buf) COHORT_THROW("PNG encode failed: " << spng_strerror(err));
  std::vector<uint8_t> out(static_cast<uint8_t*>(buf), static_cast<uint8_t*>(buf) + len);
  free(buf);
  return out;
}

std::vector<uint8_t> encode_jpeg(const Image& img, int quality) {
  COHORT_CHECK(img.bits == 8, "JPEG needs 8-bit pixels");
  TjHandle h(true);
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  int pf = img.channels == 1 ? TJPF_GRAY : TJPF_RGB;
  int sub = img.channels == 1 ? TJSAMP_GRAY : TJSAMP_420;
  if (tjCompress2(h.h, img.data.data(), img.width, 0, img.height, pf, &buf, &len, sub, quality,
                  TJFLAG_ACCURATEDCT) != 0) {
    COHORT_THROW("JPEG encode failed: " << tjGetErrorStr2(h.h));
  }
  std::vector<uint8_t> out(buf, buf + len);
  tjFree(buf);
  return out;
}

void read_file_into(const std::string& path, std::vector<uint8_t>& out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) COHORT_THROW_AS(DecodeError, path << ": cannot open: " << errno_string(errno));
  std::fseek(f, 0, SEEK_END);
  long n = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);  // keeps the capacity of earlier reads
  if (n > 0) out.resize(std::fread(out.data(), 1, out.size(), f));
  std::fclose(f);
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::vector<uint8_t> out;
  read_file_into(path, out);
  return out;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) COHORT_THROW(path << ": cannot write: " << errno_string(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::remove(tmp.c_str());
    COHORT_THROW(path << ": write failed (disk full?): " << errno_string(e));
  }
}

}  // namespace cohort::data
