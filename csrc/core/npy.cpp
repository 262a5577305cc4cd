#include "core/npy.h"

#include <cctype>
#include <cstring>
#include <limits>

#include "core/dtypes.h"
#include "core/error.h"
#include "core/file.h"

namespace fastpipe {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// numpy refuses headers above this size unless told otherwise; a larger length field is corruption.
constexpr int64_t kMaxHeaderLen = 1 << 20;

// A tiny reader for the Python-literal dict numpy writes:
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class DictParser {
 public:
  DictParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorKind::kValue, path_ + ": invalid .npy header: " + what + " (header: " + s_ + ")");
  }
  // Python's whitespace between tokens (inside brackets newlines join lines): not isspace's vertical
  // tab, which numpy's literal_eval refuses.
  void skip_ws() {
    while (i_ < s_.size() && std::strchr(" \t\n\r\f", s_[i_]) != nullptr && s_[i_] != '\0') ++i_;
  }
  bool eat(char c) {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "' at position " + std::to_string(i_));
  }
  std::string string_lit() {
    skip_ws();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) fail("expected a string at position " + std::to_string(i_));
    char q = s_[i_++];
    size_t end = s_.find(q, i_);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(i_, end - i_);
    i_ = end + 1;
    return out;
  }
  bool bool_lit() {
    skip_ws();
    if (s_.compare(i_, 4, "True") == 0) {
      i_ += 4;
      return true;
    }
    if (s_.compare(i_, 5, "False") == 0) {
      i_ += 5;
      return false;
    }
    fail("fortran_order must be True or False");
  }
  int64_t int_lit() {
    skip_ws();
    size_t start = i_;
    int64_t v = 0;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      int d = s_[i_] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - d) / 10) fail("dimension too large");
      v = v * 10 + d;
      ++i_;
    }
    if (i_ == start) fail("expected a non-negative integer in shape at position " + std::to_string(i_));
    if (i_ - start > 1 && s_[start] == '0') fail("integer with a leading zero in shape (not a Python literal)");
    if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 long literal
    return v;
  }
  std::vector<int64_t> tuple_lit() {
    expect('(');
    std::vector<int64_t> dims;
    while (!eat(')')) {
      dims.push_back(int_lit());
      if (!eat(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }
  bool at_end() {
    skip_ws();
    return i_ == s_.size();
  }
  bool peek(char c) {
    skip_ws();
    return i_ < s_.size() && s_[i_] == c;
  }

 private:
  const std::string& s_;
  const std::string& path_;
  size_t i_ = 0;
};

uint32_t read_le(const unsigned char* p, int n) {
  uint32_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

}  // namespace

NpyHeader parse_npy_header(const char* buf, size_t len, int64_t file_size, const std::string& path) {
  auto fail = [&](const std::string& what) -> void { throw Error(ErrorKind::kValue, path + ": " + what); };
  NpyHeader h;
  h.file_size = file_size;
  if (len < kMagicLen + 2 || std::memcmp(buf, kMagic, kMagicLen) != 0)
    fail("not a .npy file (missing the \\x93NUMPY magic string)");
  const auto* u = reinterpret_cast<const unsigned char*>(buf);
  h.major = u[6];
  h.minor = u[7];
  if (h.major < 1 || h.major > 3 || h.minor != 0)
    fail("unsupported .npy format version " + std::to_string(h.major) + "." + std::to_string(h.minor) +
         " (supported: 1.0, 2.0, 3.0)");
  const size_t len_bytes = h.major == 1 ? 2 : 4;
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (len < prefix) fail("file ends inside the header length field");
  const int64_t hlen = read_le(u + kMagicLen + 2, static_cast<int>(len_bytes));
  h.data_offset = static_cast<int64_t>(prefix) + hlen;
  if (hlen > kMaxHeaderLen) fail("header length " + std::to_string(hlen) + " is implausibly large (corrupt file?)");
  if (h.data_offset > file_size || static_cast<size_t>(h.data_offset) > len)
    fail("header length " + std::to_string(hlen) + " runs past the end of the file (" + std::to_string(file_size) +
         " bytes)");

  std::string text(buf + prefix, static_cast<size_t>(hlen));
  DictParser p(text, path);
  bool have_descr = false, have_order = false, have_shape = false;
  bool fortran = false;
  p.expect('{');
  while (!p.eat('}')) {
    std::string key = p.string_lit();
    p.expect(':');
    if ((key == "descr" && have_descr) || (key == "fortran_order" && have_order) || (key == "shape" && have_shape))
      p.fail("duplicate key '" + key + "'");
    if (key == "descr") {
      if (!p.peek('\'') && !p.peek('"'))
        fail("structured or record dtypes are not supported (descr must be a simple type string)");
      h.descr = p.string_lit();
      have_descr = true;
    } else if (key == "fortran_order") {
      fortran = p.bool_lit();
      have_order = true;
    } else if (key == "shape") {
      h.shape = p.tuple_lit();
      have_shape = true;
    } else {
      p.fail("unexpected key '" + key + "'");
    }
    if (!p.eat(',')) {
      p.expect('}');
      break;
    }
  }
  if (!p.at_end()) p.fail("trailing characters after the header dict");
  if (!have_descr || !have_order || !have_shape) p.fail("the header dict must have 'descr', 'fortran_order' and 'shape'");
  if (fortran) fail("array is stored in Fortran order; save it C-contiguous (np.ascontiguousarray) instead");

  const std::string& d = h.descr;
  if (d.size() < 2) fail("unsupported dtype '" + d + "'");
  char order = d[0];
  std::string code = d.substr(1);
  if (order == '>' && code != "b1" && code != "u1" && code != "i1")
    fail("big-endian dtype '" + d + "' is not supported; convert with arr.astype('<" + code + "')");
  if (order != '<' && order != '|' && order != '=' && order != '>') fail("unsupported dtype '" + d + "'");
  std::string supported;
  for (const auto& t : kDtypes) {
    supported += std::string(supported.empty() ? "" : ", ") + t.name;
    if (code == t.npy_code) {
      h.dtype = t.name;
      h.itemsize = t.itemsize;
    }
  }
  if (h.itemsize == 0) fail("unsupported dtype '" + d + "' (supported: " + supported + ")");
  if (h.shape.empty()) fail("0-d array: a dataset column needs a first (record) dimension");

  int64_t count = 1;
  for (int64_t dim : h.shape) {
    if (dim != 0 && count > std::numeric_limits<int64_t>::max() / h.itemsize / dim)
      fail("shape is too large to address");
    count *= dim;
  }
  h.data_bytes = count * h.itemsize;
  if (h.data_bytes > file_size - h.data_offset) {
    std::string shp = "(";
    for (size_t k = 0; k < h.shape.size(); ++k) shp += (k ? ", " : "") + std::to_string(h.shape[k]);
    shp += h.shape.size() == 1 ? ",)" : ")";
    fail("shape " + shp + " x itemsize " + std::to_string(h.itemsize) + " needs " + std::to_string(h.data_bytes) +
         " bytes of data but the file holds " + std::to_string(file_size - h.data_offset) + " (truncated file?)");
  }
  return h;
}

NpyHeader read_npy_header(const std::string& path) {
  File f(path, IoMode::kPread);
  const int64_t size = f.current_size();
  // The fixed prefix plus a generous header; a longer header is read in a second step.
  std::string buf(static_cast<size_t>(std::min<int64_t>(size, 4096)), '\0');
  f.read_at_most(&buf[0], static_cast<int64_t>(buf.size()), 0);
  if (buf.size() >= 12 && std::memcmp(buf.data(), kMagic, kMagicLen) == 0) {
    const auto* u = reinterpret_cast<const unsigned char*>(buf.data());
    const int major = u[6];
    const int64_t hlen = (major == 1) ? read_le(u + 8, 2) : read_le(u + 8, 4);
    const int64_t want = std::min<int64_t>(size, (major == 1 ? 10 : 12) + std::min<int64_t>(hlen, kMaxHeaderLen + 1));
    if (want > static_cast<int64_t>(buf.size())) {
      buf.resize(static_cast<size_t>(want));
      f.read_at_most(&buf[0], want, 0);
    }
  }
  return parse_npy_header(buf.data(), buf.size(), size, path);
}

}  // namespace fastpipe
