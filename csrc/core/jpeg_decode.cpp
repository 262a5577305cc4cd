#include "core/jpeg_decode.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#ifdef FASTPIPE_WITH_JPEG
#include <jpeglib.h>
#include <jerror.h>
#endif

namespace fastpipe {

#ifdef FASTPIPE_WITH_JPEG

namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings after which the pixels are wrong (libjpeg fills the rest grey, or decodes garbage) end the
// decode here. The others (extraneous bytes between markers, an unknown JFIF revision, a nonstandard
// progression) leave the image intact and are ignored, as PIL ignores them.
void on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  switch (cinfo->err->msg_code) {
    case JWRN_ARITH_BAD_CODE:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_JPEG_EOF:
    case JWRN_MUST_RESYNC:
      on_error(cinfo);
    default:
      return;
  }
}

// PIL's CMYK -> RGB (its JPEG reader takes CMYK as inverted, the Adobe convention): in place, 4 bytes
// per pixel in, 3 out.
void cmyk_to_rgb(uint8_t* row, JDIMENSION width) {
  auto muldiv255 = [](int a, int b) {
    const int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  for (JDIMENSION x = 0; x < width; ++x) {
    const uint8_t* in = row + 4 * x;
    const int nk = in[3];
    const int r = nk - muldiv255(255 - in[0], nk), g = nk - muldiv255(255 - in[1], nk),
              b = nk - muldiv255(255 - in[2], nk);
    uint8_t* out = row + 3 * x;
    out[0] = static_cast<uint8_t>(r);
    out[1] = static_cast<uint8_t>(g);
    out[2] = static_cast<uint8_t>(b);
  }
}

}  // namespace

struct JpegDecoder::State {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
};

bool jpeg_decoding_built() { return true; }

std::string jpeg_library_version() {
#ifdef LIBJPEG_TURBO_VERSION
#define FASTPIPE_STR2(x) #x
#define FASTPIPE_STR(x) FASTPIPE_STR2(x)
  return "libjpeg-turbo " FASTPIPE_STR(LIBJPEG_TURBO_VERSION);
#else
  return "libjpeg " + std::to_string(JPEG_LIB_VERSION);
#endif
}

JpegDecoder::JpegDecoder() : s_(std::make_unique<State>()) {
  s_->cinfo.err = jpeg_std_error(&s_->err.pub);
  s_->err.pub.error_exit = on_error;
  s_->err.pub.emit_message = on_message;
  s_->err.message[0] = '\0';
  jpeg_create_decompress(&s_->cinfo);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&s_->cinfo); }

namespace {

// The libjpeg calls, between setjmp and any longjmp: only trivially destructible locals here. Returns
// false with the message in s->err.message; otherwise the first column decoded (*x_first, at or left
// of x0) and the row stride.
bool decode_rows(jpeg_decompress_struct* cinfo, ErrorManager* err, const uint8_t* data, size_t size, bool cmyk,
                 int denom, JDIMENSION y0, JDIMENSION y1, JDIMENSION x0, JDIMENSION x1, uint8_t* out,
                 JDIMENSION* x_first, int64_t* stride) {
  if (setjmp(err->jump)) {
    jpeg_abort_decompress(cinfo);
    return false;
  }
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo->scale_num = 1;
  cinfo->scale_denom = static_cast<unsigned>(denom);
  cinfo->dct_method = JDCT_ISLOW;  // as PIL: the fast integer IDCT saves nothing with SIMD and is less exact
  cinfo->do_fancy_upsampling = TRUE;
  jpeg_start_decompress(cinfo);
  if (y1 > cinfo->output_height || x1 > cinfo->output_width) {
    std::snprintf(err->message, sizeof(err->message), "the decoded image is %ux%u, smaller than its header said",
                  cinfo->output_width, cinfo->output_height);
    jpeg_abort_decompress(cinfo);
    return false;
  }
  JDIMENSION xoff = x0, width = x1 - x0;
  if (x0 > 0 || x1 < cinfo->output_width) jpeg_crop_scanline(cinfo, &xoff, &width);
  if (y0 > 0) jpeg_skip_scanlines(cinfo, y0);
  const int64_t row_bytes = static_cast<int64_t>(cinfo->output_width) * cinfo->output_components;
  JSAMPROW rows[16];
  while (cinfo->output_scanline < y1) {
    const JDIMENSION n = y1 - cinfo->output_scanline < 16 ? y1 - cinfo->output_scanline : 16;
    for (JDIMENSION k = 0; k < n; ++k) rows[k] = out + (cinfo->output_scanline - y0 + k) * row_bytes;
    jpeg_read_scanlines(cinfo, rows, n);
  }
  if (cmyk)
    for (JDIMENSION y = 0; y < y1 - y0; ++y) cmyk_to_rgb(out + y * row_bytes, cinfo->output_width);
  jpeg_abort_decompress(cinfo);  // the rows below the region are never decoded
  *x_first = xoff;
  *stride = row_bytes;
  return true;
}

// libjpeg's raw output of the whole image into the planes p at out, one iMCU row at a time through
// `rows` (room for 16 rows of p.width + 32 bytes per component). Same contract as decode_rows.
bool decode_raw(jpeg_decompress_struct* cinfo, ErrorManager* err, const uint8_t* data, size_t size,
                const images::YccPlanes& p, uint8_t* out, uint8_t* rows) {
  if (setjmp(err->jump)) {
    jpeg_abort_decompress(cinfo);
    return false;
  }
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  const int components = p.gray ? 1 : 3;
  bool as_described = cinfo->num_components == components && cinfo->image_height == static_cast<JDIMENSION>(p.height) &&
                      cinfo->image_width == static_cast<JDIMENSION>(p.width) && cinfo->max_v_samp_factor <= 2 &&
                      cinfo->max_h_samp_factor <= 4;  // what `rows` has room for
  for (int c = 1; as_described && c < components; ++c)
    as_described = cinfo->comp_info[c].h_samp_factor * p.h_ratio == cinfo->max_h_samp_factor &&
                   cinfo->comp_info[c].v_samp_factor * p.v_ratio == cinfo->max_v_samp_factor;
  if (!as_described) {
    std::snprintf(err->message, sizeof(err->message),
                  "the image's components or sampling are not those of the planes it was to be decoded into");
    jpeg_abort_decompress(cinfo);
    return false;
  }
  cinfo->raw_data_out = TRUE;
  cinfo->dct_method = JDCT_ISLOW;
  jpeg_start_decompress(cinfo);
  const int row_bytes = p.width + 32, row_group = cinfo->max_v_samp_factor * DCTSIZE;
  JSAMPROW pointers[3][2 * DCTSIZE];
  JSAMPARRAY planes[3];
  for (int c = 0; c < components; ++c) {
    for (int r = 0; r < 2 * DCTSIZE; ++r) pointers[c][r] = rows + (c * 2 * DCTSIZE + r) * row_bytes;
    planes[c] = pointers[c];
  }
  for (int imcu = 0; cinfo->output_scanline < cinfo->output_height; ++imcu) {
    jpeg_read_raw_data(cinfo, planes, static_cast<JDIMENSION>(row_group));
    for (int c = 0; c < components; ++c) {
      const int plane_rows = c ? p.c_height : p.height, plane_cols = c ? p.c_width : p.width;
      const int per_imcu = cinfo->comp_info[c].v_samp_factor * DCTSIZE;
      uint8_t* plane = out + (c == 0 ? 0 : c == 1 ? p.cb_offset : p.cr_offset);
      for (int r = 0; r < per_imcu && imcu * per_imcu + r < plane_rows; ++r)
        std::memcpy(plane + static_cast<int64_t>(imcu * per_imcu + r) * plane_cols, pointers[c][r],
                    static_cast<size_t>(plane_cols));
    }
  }
  jpeg_abort_decompress(cinfo);
  return true;
}

}  // namespace

void JpegDecoder::decode_planes(const uint8_t* data, size_t size, const images::YccPlanes& p, uint8_t* out) {
  pixels_.resize(static_cast<size_t>(3 * 2 * DCTSIZE * (p.width + 32)));
  if (!decode_raw(&s_->cinfo, &s_->err, data, size, p, out, pixels_.data())) throw std::runtime_error(s_->err.message);
}

const uint8_t* JpegDecoder::decode(const uint8_t* data, size_t size, const JpegInfo& info, int denom,
                                   const images::Region& r, int64_t* stride) {
  const bool cmyk = info.components == 4;
  // A cropped decode upsamples the chroma of its first and last columns as if they were the image's
  // edges: with a margin of kMargin columns on each side (where the image has them) every column of the
  // region is decoded as the full image decodes it.
  constexpr int kMargin = 2;
  const int full_width = images::scaled_size(info.width, denom);
  const int x0 = std::max(0, r.x0 - kMargin), x1 = std::min(full_width, r.x1 + kMargin);
  // jpeg_crop_scanline widens the columns to the left by less than one iMCU (at most 32 pixels).
  const int64_t width = static_cast<int64_t>(x1 - x0) + 32;
  pixels_.resize(static_cast<size_t>((r.y1 - r.y0) * width * (cmyk ? 4 : 3)));
  JDIMENSION x_first = 0;
  if (!decode_rows(&s_->cinfo, &s_->err, data, size, cmyk, denom, static_cast<JDIMENSION>(r.y0),
                   static_cast<JDIMENSION>(r.y1), static_cast<JDIMENSION>(x0), static_cast<JDIMENSION>(x1),
                   pixels_.data(), &x_first, stride))
    throw std::runtime_error(s_->err.message);
  return pixels_.data() + static_cast<int64_t>(r.x0 - static_cast<int>(x_first)) * 3;
}

#else  // built without libjpeg

struct JpegDecoder::State {};

bool jpeg_decoding_built() { return false; }
std::string jpeg_library_version() { return ""; }

JpegDecoder::JpegDecoder() = default;
JpegDecoder::~JpegDecoder() = default;

void JpegDecoder::decode_planes(const uint8_t* data, size_t size, const images::YccPlanes&, uint8_t*) {
  decode(data, size, JpegInfo{}, 1, images::Region{}, nullptr);
}

const uint8_t* JpegDecoder::decode(const uint8_t*, size_t, const JpegInfo&, int, const images::Region&, int64_t*) {
  throw std::runtime_error(
      "fastpipe was built without JPEG support (libjpeg's headers were not found): install libjpeg62-turbo-dev "
      "(Debian/Ubuntu; `make setup` does it) or libjpeg-turbo-devel, then rebuild with `pip install "
      "--no-build-isolation -e .`");
}

#endif

}  // namespace fastpipe
