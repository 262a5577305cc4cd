#include "core/image_scan.h"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/file.h"

namespace fastpipe {
namespace {

constexpr int64_t kHeadBytes = 64 << 10;

// The header of one file: "" (and *info, *bytes) or why it cannot be used.
std::string scan_one(const std::string& path, std::vector<uint8_t>& buf, JpegInfo* info, int64_t* bytes) {
  try {
    File f(path, IoMode::kPread);
    *bytes = f.size_at_open();
    int64_t want = std::min<int64_t>(*bytes, kHeadBytes);
    for (;;) {
      buf.resize(static_cast<size_t>(want));
      const int64_t got = f.read_at_most(buf.data(), want, 0);
      std::string why;
      const JpegParse r = read_jpeg_info(buf.data(), static_cast<size_t>(got), info, &why);
      if (r == JpegParse::kOk) {
        why = jpeg_unsupported_reason(*info);
        return why.empty() ? why : "unsupported: " + why;
      }
      if (r == JpegParse::kError) return why;
      if (got < want || want == *bytes) return "truncated: the file ends inside the JPEG header";
      want = *bytes;  // a header longer than the head (large EXIF or ICC segments): read it all
    }
  } catch (const Error& e) {
    *bytes = -1;
    return e.what();
  }
}

}  // namespace

std::string check_jpeg(const uint8_t* data, size_t size, JpegInfo* info) {
  std::string why;
  switch (read_jpeg_info(data, size, info, &why)) {
    case JpegParse::kOk: break;
    case JpegParse::kNeedMore: return "truncated: the data ends inside the JPEG header";
    case JpegParse::kError: return why;
  }
  why = jpeg_unsupported_reason(*info);
  if (!why.empty()) return "unsupported: " + why;
  if (!jpeg_has_end(data, size, *info)) return "truncated: no end-of-image marker after the image data";
  return "";
}

ImageScan scan_image_files(const std::string& root, const std::string& names, const std::vector<int64_t>& offsets,
                           int threads) {
  const int64_t n = offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1;
  ImageScan s;
  s.heights.assign(static_cast<size_t>(n), 0);
  s.widths.assign(static_cast<size_t>(n), 0);
  s.bytes.assign(static_cast<size_t>(n), -1);
  std::vector<std::string> why(static_cast<size_t>(n));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    std::vector<uint8_t> buf;
    for (int64_t i; (i = next.fetch_add(64)) < n;) {
      for (int64_t k = i; k < std::min(n, i + 64); ++k) {
        const std::string path = root + "/" + names.substr(static_cast<size_t>(offsets[k]),
                                                           static_cast<size_t>(offsets[k + 1] - offsets[k]));
        JpegInfo info;
        why[k] = scan_one(path, buf, &info, &s.bytes[k]);
        if (why[k].empty()) {
          s.heights[k] = info.height;
          s.widths[k] = info.width;
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {  // out of threads: the ones started (and this one) do it all
      break;
    }
  }
  work();
  for (auto& t : pool) t.join();
  for (int64_t i = 0; i < n; ++i) {
    if (why[i].empty()) continue;
    s.bad.push_back(i);
    s.reasons.push_back(std::move(why[i]));
  }
  return s;
}

}  // namespace fastpipe
