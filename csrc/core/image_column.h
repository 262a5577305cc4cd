// A column of encoded images (JPEG, PNG, WebP; other formats through the fallback decoder): where each
// record's bytes live (one packed file, or one file per record), the size its header gave when the
// dataset was scanned or packed, and how it becomes one fixed-size image of the batch (read, header
// checked, crop drawn from the size in the header, region decoded, resampled). The arena holds only the
// decoded outputs; the encoded bytes pass through a per-thread buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/image_fallback.h"
#include "core/record_source.h"
#include "core/jpeg_decode.h"
#include "core/png_decode.h"
#include "core/resample.h"
#include "core/webp_decode.h"
#include "kernels/image_transform.h"

namespace fastpipe {

struct ImageSource {
  // ImageDataset: record i is bytes [offsets[i], offsets[i + 1]) of packed_path.
  std::string packed_path;
  std::vector<int64_t> offsets;
  // ImageFolder: record i is the file root + "/" + names[name_offsets[i], name_offsets[i + 1]).
  std::string root;
  std::string names;
  std::vector<int64_t> name_offsets;
  // WebDataset: record i is bytes [member_offsets[i], + member_sizes[i]) of shards[shard_of[i]], and
  // names[name_offsets[i], name_offsets[i + 1]) is its sample's key.
  std::vector<std::string> shards;
  std::vector<int32_t> shard_of;
  std::vector<int64_t> member_offsets, member_sizes;
  // Shards that are not local files (remote ones streaming through a cache): shard k is opened by
  // stream->open(k), and shards[k] is its URL (what messages name).
  std::shared_ptr<ShardOpener> stream;
  // Stored sizes, from the headers when the dataset was scanned or packed (0 x 0: it could not read one).
  // The crop is drawn from the header read with the record: a file rewritten since keeps working.
  std::vector<int32_t> heights, widths;

  int64_t num_records() const { return static_cast<int64_t>(heights.size()); }
  bool packed() const { return !packed_path.empty(); }
  bool members() const { return !shards.empty(); }
  std::string path_of(int64_t i) const;   // ImageFolder: the record's file; WebDataset: its shard
  std::string describe(int64_t i) const;  // for messages: the file, or the record of the packed file or shard
  // Error(kValue) naming what is inconsistent (sizes, offsets, names).
  void check() const;
};

struct ImageColumnSpec {
  std::shared_ptr<const ImageSource> source;
  images::ImageTransformParams transform;
  int64_t max_record_bytes = 64 << 20;  // an encoded image larger than this is an error naming it
  // Decoded on the device (a CUDA loader with image_decode="device"): the reader hands over per record
  // its description and its encoded bytes (up to encoded_budget), and decodes on the host only what the
  // device is not given (device_decodable says which). pixel_budget: the decoded pixels a record may
  // occupy on the device.
  bool device_decode = false;
  int64_t encoded_budget = 0;
  int64_t pixel_budget = 0;
  // Decodes what the built-in decoders do not (null: such a record is an error saying so).
  std::shared_ptr<const FallbackDecoder> fallback;
};

// The host outputs of a column decoded on the device, per record: its ImageDesc, its encoded bytes
// (encoded_budget), and its output image when the host decoded it.
constexpr int kDeviceDecodeOutputs = 3;


// A reader thread's decoders and buffers.
struct ImageThreadState {
  JpegDecoder decoder;
  PngDecoder png;
  WebpDecoder webp;
  std::vector<uint8_t> encoded;
  std::vector<uint8_t> fallback_rgb;  // a whole image from the fallback decoder
  ResampleScratch resample;
};

// The packed file of an ImageDataset, opened for pread and checked to hold every record; null for an
// ImageFolder or a WebDataset (their files are opened per record). Error(kValue) for a spec that cannot be read.
std::unique_ptr<RecordSource> open_image_column(const ImageColumnSpec& spec);

// Asks the kernel to start reading these records of a packed file (their decode follows).
void will_need_images(const ImageColumnSpec& spec, const RecordSource* packed, const int64_t* idx, int64_t count);

// Reads record `index`, decodes the region its transform needs and writes the output image to `out`;
// the crop and flip are drawn for sample `draw` of `epoch` (the record itself, unless it stands in for a
// bad image). Returns the encoded bytes read. Throws Error naming the record and why: kValue for bad
// data (no decoder reads it, corrupt, truncated), kIO when reading failed.
int64_t read_image(const ImageColumnSpec& spec, const RecordSource* packed, int64_t index, int64_t draw, uint64_t epoch,
                   void* out, ImageThreadState& ts);

// The same for a column decoded on the device: the record's ImageDesc and encoded bytes, or its output
// decoded here when the device decoder does not take it (not a JPEG, not baseline, not grayscale or YCbCr
// with standard chroma subsampling, over the byte or pixel budget, more than kDeviceTaps taps on an axis).
int64_t read_image_for_device(const ImageColumnSpec& spec, const RecordSource* packed, int64_t index, int64_t draw,
                              uint64_t epoch, images::ImageDesc* desc, uint8_t* encoded, void* out,
                              ImageThreadState& ts);

}  // namespace fastpipe
