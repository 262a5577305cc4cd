#include "core/tar_index.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>

#include "core/error.h"
#include "core/image_scan.h"
#include "core/json_field.h"

namespace fastpipe {
namespace {

constexpr int64_t kBlock = 512;
// A pax record or GNU long name longer than this is malformed (names are at most a few KiB).
constexpr int64_t kMaxMetaBytes = 1 << 20;
// A label member is a short decimal number (or, with a label field, a JSON document of at most kMaxMetaBytes).
constexpr int64_t kMaxLabelBytes = 64;

int64_t padded(int64_t size) { return (size + kBlock - 1) / kBlock * kBlock; }

[[noreturn]] void malformed(const RecordSource& f, int64_t at, const std::string& why) {
  throw Error(ErrorKind::kValue, "'" + f.path() + "' is not a valid tar archive: the entry at offset " +
                                     std::to_string(at) + " " + why);
}

// A NUL-terminated field of at most n bytes.
std::string field(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// A numeric field: octal digits (leading spaces allowed, ended by NUL or space), or GNU's base-256
// (first byte's high bit set) for values that do not fit. False when malformed or negative.
bool number(const unsigned char* p, size_t n, int64_t* out) {
  if (p[0] & 0x80) {
    if (p[0] != 0x80) return false;  // 0xff: negative
    int64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v > (INT64_MAX >> 8)) return false;
      v = (v << 8) | p[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  int64_t v = 0;
  bool digits = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v > (INT64_MAX >> 3)) return false;
    v = v * 8 + (p[i] - '0');
    digits = true;
  }
  if (i < n && p[i] != '\0' && p[i] != ' ') return false;
  *out = v;
  return digits || i == n || p[i] == '\0';
}

bool checksum_ok(const unsigned char* h) {
  int64_t stored = 0;
  if (!number(h + 148, 8, &stored)) return false;
  int64_t sum_unsigned = 0, sum_signed = 0;  // old tars summed signed chars
  for (int i = 0; i < kBlock; ++i) {
    const int c = (i >= 148 && i < 156) ? ' ' : h[i];
    sum_unsigned += c;
    sum_signed += (i >= 148 && i < 156) ? ' ' : static_cast<signed char>(h[i]);
  }
  return stored == sum_unsigned || stored == sum_signed;
}

// The data of a metadata entry (pax header, GNU long name), checked to lie inside the archive.
std::string read_meta(const RecordSource& f, int64_t at, int64_t offset, int64_t size) {
  if (size > kMaxMetaBytes) malformed(f, at, "holds " + std::to_string(size) + " bytes of metadata (more than 1 MiB)");
  std::string data(static_cast<size_t>(size), '\0');
  if (f.read_at_most(data.data(), size, offset) != size) malformed(f, at, "is cut short (its data ends past the file)");
  return data;
}

// A pax extended header's records "<length> <key>=<value>\n": the path and size it sets.
void parse_pax(const RecordSource& f, int64_t at, const std::string& data, std::string* path, int64_t* size) {
  size_t pos = 0;
  while (pos < data.size()) {
    if (data[pos] == '\0') break;  // padding some writers leave
    size_t p = pos;
    int64_t len = 0;
    while (p < data.size() && data[p] >= '0' && data[p] <= '9' && len <= kMaxMetaBytes) len = len * 10 + (data[p++] - '0');
    if (p == pos || p >= data.size() || data[p] != ' ' || len <= static_cast<int64_t>(p - pos) + 1 ||
        len > static_cast<int64_t>(data.size() - pos) || data[pos + static_cast<size_t>(len) - 1] != '\n')
      malformed(f, at, "has a malformed pax record at byte " + std::to_string(pos) + " of its header");
    const std::string record = data.substr(p + 1, pos + static_cast<size_t>(len) - 1 - (p + 1));
    const size_t eq = record.find('=');
    if (eq == std::string::npos) malformed(f, at, "has a pax record without '='");
    const std::string key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      *path = value;
    } else if (key == "size") {
      int64_t v = 0;
      bool ok = !value.empty() && value.size() <= 18;
      for (char c : value) ok = ok && c >= '0' && c <= '9';
      if (ok) v = std::stoll(value);
      if (!ok) malformed(f, at, "has a pax size that is not a number: '" + quoted_bytes(value, 32) + "'");
      *size = v;
    }
    pos += static_cast<size_t>(len);
  }
}

}  // namespace

std::vector<TarMember> read_tar_members(const RecordSource& f) {
  std::vector<TarMember> members;
  const int64_t end = f.size_at_open();
  unsigned char h[kBlock];
  std::string long_name, pax_path;
  int64_t pax_size = -1;
  bool pending_meta = false;
  for (int64_t at = 0;;) {
    if (at == end) {
      if (pending_meta) malformed(f, at, "is missing: the archive ends after a metadata entry");
      break;  // no end-of-archive blocks: accepted, as Python's tarfile does
    }
    if (end - at < kBlock) malformed(f, at, "is cut short (" + std::to_string(end - at) + " bytes of a 512-byte header)");
    if (f.read_at_most(h, kBlock, at) != kBlock) malformed(f, at, "is cut short (the file shrank)");
    if (std::all_of(h, h + kBlock, [](unsigned char c) { return c == 0; })) {
      if (pending_meta) malformed(f, at, "is missing: the archive ends after a metadata entry");
      break;
    }
    if (!checksum_ok(h)) malformed(f, at, "has a bad header checksum (not a tar header, or corrupt)");
    int64_t size = 0;
    if (!number(h + 124, 12, &size)) malformed(f, at, "has a malformed size field");
    const char type = static_cast<char>(h[156]);
    const int64_t data = at + kBlock;
    if (type == 'x' || type == 'X') {
      if (size > end - data) malformed(f, at, "is cut short (its data ends past the file)");
      parse_pax(f, at, read_meta(f, at, data, size), &pax_path, &pax_size);
      pending_meta = true;
    } else if (type == 'L') {
      if (size > end - data) malformed(f, at, "is cut short (its data ends past the file)");
      long_name = read_meta(f, at, data, size);
      long_name.resize(strnlen(long_name.c_str(), long_name.size()));
      pending_meta = true;
    } else if (type == 'K' || type == 'g') {
      pending_meta = pending_meta || type == 'K';  // a long link name belongs to the next entry; global pax headers are ignored
    } else {
      if (pax_size >= 0) size = pax_size;
      const bool regular = type == '0' || type == '\0' || type == '7';
      if (regular) {
        std::string name = !pax_path.empty() ? pax_path : !long_name.empty() ? long_name : field(reinterpret_cast<char*>(h), 100);
        if (pax_path.empty() && long_name.empty() && std::memcmp(h + 257, "ustar", 5) == 0) {
          const std::string prefix = field(reinterpret_cast<char*>(h) + 345, 155);
          if (!prefix.empty()) name = prefix + "/" + name;
        }
        if (size > end - data) malformed(f, at, "('" + quoted_bytes(name, 200) + "', " + std::to_string(size) +
                                                    " bytes) is cut short: the file ends " + std::to_string(end - data) +
                                                    " bytes into its data");
        members.push_back({std::move(name), data, size});
      }
      // Links, directories and device entries carry no data whatever their size field says.
      if (!regular && type >= '1' && type <= '6') size = 0;
      long_name.clear();
      pax_path.clear();
      pax_size = -1;
      pending_meta = false;
    }
    if (size > end - data) malformed(f, at, "is cut short (its data ends past the file)");
    at = data + padded(size);
    if (at > end) at = end;  // the last member's padding may be missing
  }
  return members;
}

bool split_webdataset_name(const std::string& name, std::string* key, std::string* extension) {
  // webdataset's regex ^((?:.*/|)[^.]+)[.]([^/]*)$: the key ends at the first dot after some slash (or the
  // start) with at least one character before it, and the extension holds no slash.
  size_t start = name.rfind('/');
  start = start == std::string::npos ? 0 : start + 1;
  for (;;) {
    const size_t dot = name.find('.', start);
    if (dot != std::string::npos && dot > start && name.find('/', dot) == std::string::npos) {
      *key = name.substr(0, dot);
      *extension = name.substr(dot + 1);
      std::transform(extension->begin(), extension->end(), extension->begin(),
                     [](unsigned char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); });
      return true;
    }
    if (start == 0) return false;
    const size_t slash = start >= 2 ? name.rfind('/', start - 2) : std::string::npos;
    start = slash == std::string::npos ? 0 : slash + 1;
  }
}

namespace {

struct ShardSamples {
  std::vector<int64_t> offsets, sizes, labels;
  std::vector<std::string> keys;
  std::vector<int32_t> heights, widths;
  std::vector<int8_t> formats;
  std::vector<std::string> why;  // per sample: why its image cannot be decoded, or ""
  int64_t without_image = 0;
};

int64_t parse_label(const RecordSource& f, const TarMember& m, const std::string& field) {
  const std::string where = "'" + f.path() + "' member '" + quoted_bytes(m.name, 200) + "'";
  const int64_t limit = field.empty() ? kMaxLabelBytes : kMaxMetaBytes;
  FP_CHECK_VALUE(m.size <= limit, where + " is " + std::to_string(m.size) + " bytes: " +
                                      (field.empty() ? "not a label (a decimal integer)" : "more than 1 MiB of JSON"));
  std::string text(static_cast<size_t>(m.size), '\0');
  if (f.read_at_most(text.data(), m.size, m.offset) != m.size)
    throw Error(ErrorKind::kIO, where + ": the file shrank while it was read");
  if (!field.empty()) {
    int64_t v = 0;
    const std::string why = json_integer_field(text.data(), text.size(), field, &v);
    FP_CHECK_VALUE(why.empty(), where + " " + why);
    return v;
  }
  size_t b = 0, e = text.size();
  while (b < e && std::strchr(" \t\r\n", text[b]) && text[b]) ++b;
  while (e > b && std::strchr(" \t\r\n", text[e - 1]) && text[e - 1]) --e;
  int64_t v = 0;
  bool ok = b < e && e - b <= 18;
  for (size_t i = b; ok && i < e; ++i) {
    ok = text[i] >= '0' && text[i] <= '9';
    v = v * 10 + (text[i] - '0');
  }
  FP_CHECK_VALUE(ok, where + " holds '" + quoted_bytes(text, 32) + "': a label must be a non-negative decimal integer");
  return v;
}

ShardSamples group_samples(const RecordSource& f, const std::vector<TarMember>& members,
                           const std::vector<std::string>& image_extensions, const std::string& label_extension,
                           const std::string& label_field) {
  ShardSamples s;
  std::string key, ext, current;
  std::vector<std::string> seen;  // the current sample's extensions
  const TarMember *image = nullptr, *label = nullptr;
  bool open = false;
  auto finish = [&] {
    if (!open) return;
    if (!image) {
      ++s.without_image;
      return;
    }
    FP_CHECK_VALUE(label, "'" + f.path() + "': sample '" + quoted_bytes(current, 200) + "' has no '." + label_extension +
                              "' member (its label)");
    s.offsets.push_back(image->offset);
    s.sizes.push_back(image->size);
    s.labels.push_back(parse_label(f, *label, label_field));
    s.keys.push_back(current);
  };
  for (const TarMember& m : members) {
    const std::string first = m.name.substr(0, m.name.find('/'));
    if (first.size() >= 4 && first.rfind("__", 0) == 0 && first.compare(first.size() - 2, 2, "__") == 0)
      continue;  // webdataset's metadata: a member __name__, or any member under a folder __name__/
    if (!split_webdataset_name(m.name, &key, &ext)) continue;
    if (!open || key != current) {
      finish();
      current = key;
      seen.clear();
      image = label = nullptr;
      open = true;
    }
    FP_CHECK_VALUE(std::find(seen.begin(), seen.end(), ext) == seen.end(),
                   "'" + f.path() + "': sample '" + quoted_bytes(current, 200) + "' holds two '." + quoted_bytes(ext, 64) +
                       "' members (webdataset refuses such a shard too)");
    seen.push_back(ext);
    const size_t dot = ext.rfind('.');
    const std::string last = dot == std::string::npos ? ext : ext.substr(dot + 1);
    if (!image && std::find(image_extensions.begin(), image_extensions.end(), last) != image_extensions.end())
      image = &m;
    if (ext == label_extension) label = &m;
  }
  finish();
  return s;
}

}  // namespace

WebDatasetIndex index_webdataset(const std::vector<std::string>& shards, const std::vector<std::string>& image_extensions,
                                 const std::string& label_extension, const std::string& label_field, int threads) {
  const int64_t n_shards = static_cast<int64_t>(shards.size());
  std::vector<ShardSamples> per(static_cast<size_t>(n_shards));
  std::exception_ptr failure;
  std::mutex failure_mutex;
  for_each_index(n_shards, threads, 1, [&](int64_t k, std::vector<uint8_t>& buf) {
    try {
      auto f = open_record_source(shards[k], IoMode::kPread);
      ShardSamples& s = per[k];
      s = group_samples(*f, read_tar_members(*f), image_extensions, label_extension, label_field);
      const size_t n = s.offsets.size();
      s.heights.assign(n, 0);
      s.widths.assign(n, 0);
      s.formats.assign(n, 0);
      s.why.assign(n, "");
      for (size_t i = 0; i < n; ++i) {  // the image headers, read as an image folder's scan reads them
        ImageHeader header;
        s.why[i] = scan_region(*f, s.offsets[i], s.sizes[i], buf, &header);
        s.formats[i] = static_cast<int8_t>(header.format);
        if (s.why[i].empty()) {
          s.heights[i] = header.height;
          s.widths[i] = header.width;
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  });
  if (failure) std::rethrow_exception(failure);

  WebDatasetIndex x;
  x.key_offsets.push_back(0);
  for (int64_t k = 0; k < n_shards; ++k) {
    ShardSamples& s = per[k];
    const int64_t first = static_cast<int64_t>(x.offsets.size());
    x.shard_of.insert(x.shard_of.end(), s.offsets.size(), static_cast<int32_t>(k));
    x.offsets.insert(x.offsets.end(), s.offsets.begin(), s.offsets.end());
    x.sizes.insert(x.sizes.end(), s.sizes.begin(), s.sizes.end());
    x.labels.insert(x.labels.end(), s.labels.begin(), s.labels.end());
    x.heights.insert(x.heights.end(), s.heights.begin(), s.heights.end());
    x.widths.insert(x.widths.end(), s.widths.begin(), s.widths.end());
    x.formats.insert(x.formats.end(), s.formats.begin(), s.formats.end());
    for (size_t i = 0; i < s.keys.size(); ++i) {
      x.keys += s.keys[i];
      x.key_offsets.push_back(static_cast<int64_t>(x.keys.size()));
      if (s.why[i].empty()) continue;
      x.bad.push_back(first + static_cast<int64_t>(i));
      x.reasons.push_back(std::move(s.why[i]));
    }
    x.without_image.push_back(s.without_image);
  }
  return x;
}

}  // namespace fastpipe
