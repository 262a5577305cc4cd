#include "core/image_column.h"

#include <cstring>
#include <exception>

#include "core/error.h"

namespace fastpipe {
namespace {

[[noreturn]] void bad_image(const ImageSource& src, int64_t i, const std::string& why) {
  throw Error(ErrorKind::kValue, "image " + src.describe(i) + ": " + why);
}

// The encoded bytes of record i into ts.encoded.
int64_t read_encoded(const ImageColumnSpec& spec, const RecordSource* packed, int64_t i, ImageThreadState& ts) {
  const ImageSource& src = *spec.source;
  int64_t size = 0;
  std::unique_ptr<RecordSource> own;
  const RecordSource* f = packed;
  int64_t offset = 0;
  if (src.packed()) {
    offset = src.offsets[i];
    size = src.offsets[i + 1] - offset;
  } else if (src.members()) {
    try {
      own = src.stream ? src.stream->open(src.shard_of[i]) : open_record_source(src.path_of(i), IoMode::kPread);
    } catch (const Error& e) {
      throw Error(e.kind(), "image " + src.describe(i) + ": " + e.what(), e.error_number());
    }
    f = own.get();
    offset = src.member_offsets[i];
    size = src.member_sizes[i];
  } else {
    try {
      own = open_record_source(src.path_of(i), IoMode::kPread);
    } catch (const Error& e) {
      throw Error(e.kind(), std::string(e.what()) + " (record " + std::to_string(i) + ")", e.error_number());
    }
    f = own.get();
    size = f->size_at_open();
  }
  if (size > spec.max_record_bytes)
    bad_image(src, i, "it is " + std::to_string(size) + " bytes, more than max_record_bytes=" +
                          std::to_string(spec.max_record_bytes) + " (the per-thread buffer for one encoded image)");
  ts.encoded.resize(static_cast<size_t>(size));
  int64_t got = 0;
  try {
    got = f->read_at_most(ts.encoded.data(), size, offset);
  } catch (const Error& e) {
    throw Error(e.kind(), "image " + src.describe(i) + ": " + e.what(), e.error_number());
  }
  if (got < size)
    throw Error(ErrorKind::kIO, "image " + src.describe(i) + ": only " + std::to_string(got) + " of its " +
                                    std::to_string(size) + " bytes could be read (the file shrank)");
  return size;
}

}  // namespace

std::string ImageSource::path_of(int64_t i) const {
  if (members()) return shards[static_cast<size_t>(shard_of[i])];
  return root + "/" + names.substr(static_cast<size_t>(name_offsets[i]),
                                   static_cast<size_t>(name_offsets[i + 1] - name_offsets[i]));
}

std::string ImageSource::describe(int64_t i) const {
  if (members())
    return "sample '" + quoted_bytes(names.substr(static_cast<size_t>(name_offsets[i]),
                                                  static_cast<size_t>(name_offsets[i + 1] - name_offsets[i])),
                                     200) +
           "' of '" + path_of(i) + "' (record " + std::to_string(i) + ": " + std::to_string(member_sizes[i]) +
           " bytes at offset " + std::to_string(member_offsets[i]) + ")";
  if (!packed()) return "'" + path_of(i) + "'";
  return "record " + std::to_string(i) + " of '" + packed_path + "' (" + std::to_string(offsets[i + 1] - offsets[i]) +
         " bytes at offset " + std::to_string(offsets[i]) + ")";
}

void ImageSource::check() const {
  const int64_t n = num_records();
  FP_CHECK_VALUE(static_cast<int64_t>(widths.size()) == n, "image sizes: heights and widths differ in length");
  for (int64_t i = 0; i < n; ++i)
    FP_CHECK_VALUE(heights[i] >= 0 && widths[i] >= 0, "image sizes: record " + std::to_string(i) + " has a negative size");
  if (packed()) {
    FP_CHECK_VALUE(static_cast<int64_t>(offsets.size()) == n + 1,
                   "'" + packed_path + "': " + std::to_string(offsets.size()) + " offsets for " + std::to_string(n) +
                       " records (need records + 1)");
    FP_CHECK_VALUE(n == 0 || offsets[0] >= 0, "'" + packed_path + "': a negative offset");
    for (int64_t i = 0; i < n; ++i)
      FP_CHECK_VALUE(offsets[i + 1] >= offsets[i], "'" + packed_path + "': offsets decrease at record " + std::to_string(i));
    return;
  }
  const std::string what = members() ? "webdataset shards" : "image folder '" + root + "'";
  FP_CHECK_VALUE(static_cast<int64_t>(name_offsets.size()) == n + 1 && (n == 0 || name_offsets[0] == 0) &&
                     name_offsets[n] == static_cast<int64_t>(names.size()),
                 what + ": the names do not match their offsets");
  for (int64_t i = 0; i < n; ++i)
    FP_CHECK_VALUE(name_offsets[i + 1] > name_offsets[i], what + ": record " + std::to_string(i) + " has an empty name");
  if (!members()) return;
  FP_CHECK_VALUE(!stream || stream->num_shards() == shards.size(), what + ": the stream holds another number of shards");
  FP_CHECK_VALUE(static_cast<int64_t>(shard_of.size()) == n && static_cast<int64_t>(member_offsets.size()) == n &&
                     static_cast<int64_t>(member_sizes.size()) == n,
                 what + ": shard_of, offsets and sizes must hold one entry per record");
  for (int64_t i = 0; i < n; ++i)
    FP_CHECK_VALUE(shard_of[i] >= 0 && shard_of[i] < static_cast<int64_t>(shards.size()) && member_offsets[i] >= 0 &&
                       member_sizes[i] >= 0,
                   what + ": record " + std::to_string(i) + " names no shard, or a negative offset or size");
}

std::unique_ptr<RecordSource> open_image_column(const ImageColumnSpec& spec) {
  FP_CHECK_VALUE(spec.source, "an image column needs its source");
  const ImageSource& src = *spec.source;
  src.check();
  const images::ImageTransformParams& p = spec.transform;
  FP_CHECK_VALUE(p.out_height >= 1 && p.out_width >= 1, "the image transform's output size must be positive");
  FP_CHECK_VALUE(spec.max_record_bytes >= 1, "max_record_bytes must be positive");
  if (!src.packed()) return nullptr;
  auto f = open_record_source(src.packed_path, IoMode::kPread);
  const int64_t need = src.offsets.back();
  FP_CHECK_VALUE(f->size_at_open() >= need, "'" + src.packed_path + "' is " + std::to_string(f->size_at_open()) +
                                                " bytes but its offsets need " + std::to_string(need) +
                                                " (was it truncated?)");
  return f;
}

void will_need_images(const ImageColumnSpec& spec, const RecordSource* packed, const int64_t* idx, int64_t count) {
  if (!packed) return;
  const std::vector<int64_t>& off = spec.source->offsets;
  for (int64_t k = 0; k < count; ++k) packed->will_need(off[idx[k]], off[idx[k] + 1] - off[idx[k]]);
}

namespace {

// Record i's bytes read into ts.encoded and its header parsed and checked (a format read here, or one
// for the fallback decoder; its data complete): the bytes, and *header.
int64_t load_checked(const ImageColumnSpec& spec, const RecordSource* packed, int64_t i, ImageThreadState& ts,
                     ImageHeader* header) {
  const ImageSource& src = *spec.source;
  const int64_t bytes = read_encoded(spec, packed, i, ts);
  const uint8_t* data = ts.encoded.data();
  std::string why;
  switch (read_image_header(data, static_cast<size_t>(bytes), header, &why)) {
    case HeaderParse::kOk: break;
    case HeaderParse::kNeedMore: bad_image(src, i, header_truncation(*header, "file"));
    case HeaderParse::kError: bad_image(src, i, why);
  }
  why = image_truncation(data, static_cast<size_t>(bytes), *header);
  if (!why.empty()) bad_image(src, i, why);
  return bytes;
}

// The geometry of sample `draw` of `epoch` for an image of that size; decoders other than libjpeg do not
// scale in the DCT.
images::Geometry geometry_for(const ImageColumnSpec& spec, ImageFormat format, int height, int width, int64_t draw,
                              uint64_t epoch) {
  images::ImageTransformParams p = spec.transform;
  if (format != ImageFormat::kJpeg) p.max_dct_denom = 1;
  return images::image_geometry(p, height, width, epoch, static_cast<uint64_t>(draw));
}

// Whether a built-in decoder reads this header's image (a build without one hands that format to the
// fallback decoder).
bool decoded_here(const ImageHeader& h) {
  switch (h.format) {
    case ImageFormat::kJpeg: return jpeg_decoding_built();
    case ImageFormat::kPng: return png_decoding_built();
    case ImageFormat::kWebp: return webp_decoding_built() && !h.webp.animated;
    default: return false;
  }
}

// The record in ts.encoded decoded by the fallback decoder, whole, and resampled into `out`.
// `failed`: why a built-in decoder could not ("" when none was tried).
void fallback_into(const ImageColumnSpec& spec, int64_t i, const ImageHeader& header, int64_t bytes,
                   const std::string& failed, int64_t draw, uint64_t epoch, void* out, ImageThreadState& ts) {
  const ImageSource& src = *spec.source;
  const std::string what = header.format == ImageFormat::kOther ? std::string("a ") + header.other + " image"
                           : header.format == ImageFormat::kUnknown ? std::string("not an image format this library knows")
                                                                     : std::string("a ") + image_format_name(header.format);
  if (!spec.fallback) {
    bad_image(src, i, failed.empty() ? what + ", and no fallback decoder (Pillow) was given to read it"
                                     : "cannot be decoded: " + failed);
  }
  int height = 0, width = 0;
  try {
    spec.fallback->decode(ts.encoded.data(), static_cast<size_t>(bytes), &ts.fallback_rgb, &height, &width);
  } catch (const std::runtime_error& e) {
    bad_image(src, i, (failed.empty() ? what : "cannot be decoded: " + failed) +
                          "; Pillow cannot decode it either (" + e.what() + ")");
  }
  const images::Geometry g = geometry_for(spec, ImageFormat::kOther, height, width, draw, epoch);
  const images::Region r = images::taps_region(g);
  const int64_t stride = static_cast<int64_t>(width) * 3;
  resample_image(spec.transform, g, ts.fallback_rgb.data() + r.y0 * stride + r.x0 * 3, stride, r, out, ts.resample);
}

// The checked record in ts.encoded decoded (the region the geometry of sample `draw` reads) and
// resampled into `out`.
void decode_into(const ImageColumnSpec& spec, int64_t i, const ImageHeader& header, int64_t bytes, int64_t draw,
                 uint64_t epoch, void* out, ImageThreadState& ts) {
  if (!decoded_here(header)) return fallback_into(spec, i, header, bytes, "", draw, epoch, out, ts);
  const uint8_t* data = ts.encoded.data();
  const images::Geometry g = geometry_for(spec, header.format, header.height, header.width, draw, epoch);
  const images::Region r = images::taps_region(g);
  const uint8_t* pixels = nullptr;
  int64_t stride = 0;
  if (r.y1 > r.y0 && r.x1 > r.x0) {
    try {
      switch (header.format) {
        case ImageFormat::kJpeg:
          pixels = ts.decoder.decode(data, static_cast<size_t>(bytes), header.jpeg, g.denom, r, &stride);
          break;
        case ImageFormat::kPng:
          pixels = ts.png.decode(data, static_cast<size_t>(bytes), header.png, r, &stride);
          break;
        default:
          pixels = ts.webp.decode(data, static_cast<size_t>(bytes), header.webp, r, &stride);
      }
    } catch (const std::runtime_error& e) {
      // A damaged JPEG is an error (Pillow would decode grey or garbage). A PNG or WebP that Pillow reads
      // anyway (a bad checksum, which it does not verify) is read as torchvision reads it.
      if (header.format == ImageFormat::kJpeg) bad_image(*spec.source, i, std::string("cannot be decoded: ") + e.what());
      return fallback_into(spec, i, header, bytes, e.what(), draw, epoch, out, ts);
    }
  }
  resample_image(spec.transform, g, pixels, stride, r, out, ts.resample);
}

// Why a record (its header, its geometry at full size, its encoded bytes) is decoded on the host rather
// than on the device, or nullptr and the planes the device decodes it into.
const char* host_decode_reason(const ImageColumnSpec& spec, const ImageHeader& header, const images::Geometry& g,
                               int64_t bytes, images::YccPlanes* planes) {
  if (header.format != ImageFormat::kJpeg) return "not a JPEG";
  const JpegInfo& info = header.jpeg;
  if (const char* why = device_jpeg_planes(info, planes)) return why;
  if (bytes > spec.encoded_budget) return "over the encoded budget";
  if (static_cast<int64_t>(info.height) * info.width > spec.pixel_budget) return "over the pixel budget";
  if (images::max_taps(g.y) > images::kDeviceTaps || images::max_taps(g.x) > images::kDeviceTaps)
    return "a shrink of more than 4x";
  return nullptr;
}

}  // namespace

int64_t read_image(const ImageColumnSpec& spec, const RecordSource* packed, int64_t i, int64_t draw, uint64_t epoch,
                   void* out, ImageThreadState& ts) {
  ImageHeader header;
  const int64_t bytes = load_checked(spec, packed, i, ts, &header);
  decode_into(spec, i, header, bytes, draw, epoch, out, ts);
  return bytes;
}

int64_t read_image_for_device(const ImageColumnSpec& spec, const RecordSource* packed, int64_t i, int64_t draw,
                              uint64_t epoch, images::ImageDesc* desc, uint8_t* encoded, void* out,
                              ImageThreadState& ts) {
  ImageHeader header;
  const int64_t bytes = load_checked(spec, packed, i, ts, &header);
  images::ImageTransformParams whole = spec.transform;
  whole.max_dct_denom = 1;  // the device decodes the whole image at full size
  const images::Geometry g = images::image_geometry(whole, header.height, header.width, epoch,
                                                    static_cast<uint64_t>(draw));
  *desc = images::ImageDesc{};
  desc->height = header.height;
  desc->width = header.width;
  desc->encoded_bytes = bytes;
  if (!host_decode_reason(spec, header, g, bytes, &desc->planes)) {
    desc->on = static_cast<int32_t>(images::DecodeOn::kDevice);
    desc->geometry = g;
    std::memcpy(encoded, ts.encoded.data(), static_cast<size_t>(bytes));
  } else {
    desc->on = static_cast<int32_t>(images::DecodeOn::kHost);
    decode_into(spec, i, header, bytes, draw, epoch, out, ts);
  }
  return bytes;
}

}  // namespace fastpipe
