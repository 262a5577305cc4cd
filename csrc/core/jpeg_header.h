// A JPEG's header read without decoding it: size, components, coding process, chroma sampling, Adobe
// colour transform, EXIF orientation, and where the first scan starts. Used to scan image folders (the
// stored sizes the crop boxes are drawn from), to say what a file that is not a JPEG is, and before
// every decode. Untrusted input: every length is bounds-checked (fuzzed: tests/fuzz/jpeg_header_fuzz.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/jpeg_color.h"

namespace fastpipe {

struct JpegInfo {
  int width = 0, height = 0, components = 0, precision = 0;
  int sof = -1;  // the frame marker's number n of SOFn (0 baseline, 1 extended, 2 progressive, 9+ arithmetic)
  int h_samp[4] = {}, v_samp[4] = {};
  int adobe_transform = -1;  // -1: no Adobe APP14 marker
  int orientation = 1;       // EXIF orientation tag (1: as stored, also when absent)
  int64_t sos_offset = 0;    // of the first SOS marker
};

enum class JpegParse {
  kOk,        // the header up to the first SOS was read
  kNeedMore,  // the header continues past the bytes given (read more of the file and parse again)
  kError,     // not a JPEG, or a malformed header: *reason says why
};

// Parses data[0, size) up to the first scan.
JpegParse read_jpeg_info(const uint8_t* data, size_t size, JpegInfo* info, std::string* reason);

// What a file that is not a JPEG holds, from its first bytes ("PNG", "GIF", ...), or "" when unknown.
const char* sniff_image_format(const uint8_t* data, size_t size);

// Why the decoder cannot decode a parsed JPEG (12-bit, lossless, hierarchical, 2 components, ...), or "".
std::string jpeg_unsupported_reason(const JpegInfo& info);

// Which JPEGs a device decoder is given (the one rule the reader, the simulated device and the test hooks
// share): baseline, grayscale or YCbCr (not Adobe's RGB) with chroma sampled 1x1 and Y at 1, 2 or 4 across
// and 1 or 2 down, decoded into `*planes` (nvJPEG's planar layout). Returns why not, or nullptr.
const char* device_jpeg_planes(const JpegInfo& info, images::YccPlanes* planes);

// Whether an end-of-image marker follows the first scan: a file cut short has none.
bool jpeg_has_end(const uint8_t* data, size_t size, const JpegInfo& info);

// "baseline", "progressive", ... for reports.
const char* jpeg_process_name(int sof);

}  // namespace fastpipe
