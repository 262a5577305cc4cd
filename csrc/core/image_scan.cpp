#include "core/image_scan.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/file.h"

namespace fastpipe {
namespace {

// Enough for the header of nearly every file; a longer one is read in growing steps.
constexpr int64_t kHeadBytes = 4 << 10;

// The header of one file: "" (and *header, *bytes, *mtime) or why it cannot be used.
std::string scan_one(const std::string& path, std::vector<uint8_t>& buf, ImageHeader* header, int64_t* bytes,
                     int64_t* mtime) {
  try {
    File f(path, IoMode::kPread);
    *bytes = f.size_at_open();
    *mtime = f.mtime_ns_at_open();
    return scan_region(f, 0, *bytes, buf, header);
  } catch (const Error& e) {
    *bytes = -1;
    return e.what();
  }
}

std::string name_of(const std::string& names, const std::vector<int64_t>& offsets, int64_t k) {
  return names.substr(static_cast<size_t>(offsets[k]), static_cast<size_t>(offsets[k + 1] - offsets[k]));
}

}  // namespace

std::string scan_region(const RecordSource& f, int64_t offset, int64_t size, std::vector<uint8_t>& buf,
                        ImageHeader* header) {
  try {
    int64_t want = std::min<int64_t>(size, kHeadBytes);
    for (;;) {
      buf.resize(static_cast<size_t>(want));
      const int64_t got = f.read_at_most(buf.data(), want, offset);
      std::string why;
      const HeaderParse r = read_image_header(buf.data(), static_cast<size_t>(got), header, &why);
      if (r == HeaderParse::kOk) return "";
      if (r == HeaderParse::kError) return why;
      if (got < want || want == size) return header_truncation(*header, "file");
      want = std::min(size, want * 16);  // a header longer than the head (large EXIF or ICC segments)
    }
  } catch (const Error& e) {
    return e.what();
  }
}

void for_each_index(int64_t n, int threads, int64_t block, const std::function<void(int64_t, std::vector<uint8_t>&)>& body) {
  std::atomic<int64_t> next{0};
  auto work = [&] {
    std::vector<uint8_t> buf;
    for (int64_t i; (i = next.fetch_add(block)) < n;)
      for (int64_t k = i; k < std::min(n, i + block); ++k) body(k, buf);
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
}

std::string check_image(const uint8_t* data, size_t size, ImageHeader* header) {
  std::string why;
  switch (read_image_header(data, size, header, &why)) {
    case HeaderParse::kOk: break;
    case HeaderParse::kNeedMore: return header_truncation(*header, "data");
    case HeaderParse::kError: return why;
  }
  return image_truncation(data, size, *header);
}

ImageScan scan_image_files(const std::string& root, const std::string& names, const std::vector<int64_t>& offsets,
                           int threads) {
  const int64_t n = offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1;
  ImageScan s;
  s.heights.assign(static_cast<size_t>(n), 0);
  s.widths.assign(static_cast<size_t>(n), 0);
  s.formats.assign(static_cast<size_t>(n), 0);
  s.bytes.assign(static_cast<size_t>(n), -1);
  s.mtimes.assign(static_cast<size_t>(n), -1);
  std::vector<std::string> why(static_cast<size_t>(n));
  for_each_index(n, threads, 64, [&](int64_t k, std::vector<uint8_t>& buf) {
    ImageHeader header;
    why[k] = scan_one(root + "/" + name_of(names, offsets, k), buf, &header, &s.bytes[k], &s.mtimes[k]);
    s.formats[k] = static_cast<int8_t>(header.format);
    if (why[k].empty()) {
      s.heights[k] = header.height;
      s.widths[k] = header.width;
    }
  });
  for (int64_t i = 0; i < n; ++i) {
    if (why[i].empty()) continue;
    s.bad.push_back(i);
    s.reasons.push_back(std::move(why[i]));
  }
  return s;
}

void stat_image_files(const std::string& root, const std::string& names, const std::vector<int64_t>& offsets,
                      int threads, std::vector<int64_t>* bytes, std::vector<int64_t>* mtimes) {
  const int64_t n = offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1;
  bytes->assign(static_cast<size_t>(n), -1);
  mtimes->assign(static_cast<size_t>(n), -1);
  for_each_index(n, threads, 64, [&](int64_t k, std::vector<uint8_t>&) {
    int64_t b = 0, m = 0;
    if (stat_path(root + "/" + name_of(names, offsets, k), &b, &m)) {
      (*bytes)[k] = b;
      (*mtimes)[k] = m;
    }
  });
}

}  // namespace fastpipe
