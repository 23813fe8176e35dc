#include <spng.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

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
  return info;
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
