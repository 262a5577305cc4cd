// Reading the headers of many image files at once (an ImageFolder's first scan): each file's size in
// bytes and its JPEG header's height and width, or why it is not a JPEG this library decodes, read by a
// few threads (the first 64 KiB of each file; the whole file when its header is longer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/jpeg_header.h"

namespace fastpipe {

struct ImageScan {
  std::vector<int32_t> heights, widths;  // 0 where the file is not a decodable JPEG
  std::vector<int64_t> bytes;            // file sizes (-1 where the file could not be read)
  std::vector<int64_t> bad;              // records that are not decodable JPEGs
  std::vector<std::string> reasons;      // why, per entry of bad
};

// The headers of files root + "/" + names[offsets[i], offsets[i + 1]) for every i, with `threads`
// threads. Never throws for a bad file: it is listed with its reason.
ImageScan scan_image_files(const std::string& root, const std::string& names, const std::vector<int64_t>& offsets,
                           int threads);

// The header of one encoded image held in memory: "" and *info, or why it is not a decodable JPEG.
std::string check_jpeg(const uint8_t* data, size_t size, JpegInfo* info);

}  // namespace fastpipe
