// Reading the headers of many image files at once (an image folder's scan): each file's size in bytes,
// format and header's height and width, or why it cannot be read, by a few threads. A file's first
// 4 KiB are read, and more only when its header is longer (a JPEG's EXIF or ICC segments).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/image_format.h"
#include "core/record_source.h"

namespace fastpipe {

struct ImageScan {
  std::vector<int32_t> heights, widths;  // 0 where the size is not known (another format, or a bad file)
  std::vector<int8_t> formats;           // ImageFormat
  std::vector<int64_t> bytes;            // file sizes (-1 where the file could not be read)
  std::vector<int64_t> mtimes;           // modification times, ns (what a later scan compares)
  std::vector<int64_t> bad;              // records that cannot be decoded
  std::vector<std::string> reasons;      // why, per entry of bad
};

// The headers of files root + "/" + names[offsets[i], offsets[i + 1]) for every i, with `threads`
// threads. Never throws for a bad file: it is listed with its reason.
// A file of another format (kOther, kUnknown) is not bad here: the fallback decoder's scan says.
ImageScan scan_image_files(const std::string& root, const std::string& names, const std::vector<int64_t>& offsets,
                           int threads);

// The header of the encoded image at [offset, offset + size) of `f`, read as the scan reads a file's (its
// first 4 KiB, more when the header is longer): "" and *header, or why it cannot be used. Never throws.
std::string scan_region(const RecordSource& f, int64_t offset, int64_t size, std::vector<uint8_t>& buf,
                        ImageHeader* header);

// body(k, buffer) for every k in [0, n), on `threads` threads (the calling one included), `block` indices
// at a time; each thread has its own buffer. body must not throw.
void for_each_index(int64_t n, int threads, int64_t block, const std::function<void(int64_t, std::vector<uint8_t>&)>& body);

// The sizes and modification times (ns) of those files, as a later scan checks which changed (-1, -1
// where a file cannot be stat'ed).
void stat_image_files(const std::string& root, const std::string& names, const std::vector<int64_t>& offsets,
                      int threads, std::vector<int64_t>* bytes, std::vector<int64_t>* mtimes);

// The header of one encoded image held in memory, and that its data is complete: "" and *header, or why
// not. A format without a decoder here is kOther or kUnknown, not an error.
std::string check_image(const uint8_t* data, size_t size, ImageHeader* header);

}  // namespace fastpipe
