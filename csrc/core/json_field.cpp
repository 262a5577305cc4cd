#include "core/json_field.h"

#include "core/error.h"

namespace fastpipe {
namespace {

// Nesting deeper than this is refused (Python's own limit is its recursion limit, ~1000).
constexpr int kMaxDepth = 512;

class Parser {
 public:
  Parser(const char* data, size_t size) : p_(data), end_(data + size) {}

  std::string field(const std::string& name, int64_t* value) {
    if (end_ - p_ >= 3 && static_cast<unsigned char>(p_[0]) == 0xEF && static_cast<unsigned char>(p_[1]) == 0xBB &&
        static_cast<unsigned char>(p_[2]) == 0xBF)
      p_ += 3;  // a UTF-8 byte order mark, as json.loads(bytes) accepts
    space();
    if (!more() || *p_ != '{') return "is not a JSON object";
    ++p_;
    const char *value_begin = nullptr, *value_end = nullptr;  // the field's last occurrence
    space();
    if (more() && *p_ == '}') {
      ++p_;
    } else {
      for (;;) {
        std::string key;
        bool exact = true;
        space();
        if (!string(&key, &exact)) return error_;
        space();
        if (!more() || *p_ != ':') return fail("expected ':' after a key");
        ++p_;
        space();
        const char* start = p_;
        if (!skip_value(1)) return error_;
        if (exact && key == name) {
          value_begin = start;
          value_end = p_;
        }
        space();
        if (!more()) return fail("unterminated object");
        if (*p_ == ',') {
          ++p_;
          continue;
        }
        if (*p_ != '}') return fail("expected ',' or '}'");
        ++p_;
        break;
      }
    }
    space();
    if (more()) return fail("extra data after the object");
    if (!value_begin) return "has no field '" + name + "'";
    const std::string why = integer(value_begin, value_end, value);
    return why.empty() ? "" : "has field '" + name + "' = " + why;
  }

 private:
  bool more() const { return p_ < end_; }
  void space() {
    while (more() && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  std::string fail(const std::string& why) {
    error_ = "is not valid JSON: " + why;
    return error_;
  }
  bool failed(const std::string& why) {
    fail(why);
    return false;
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool hex4(unsigned* u) {
    if (end_ - p_ < 4) return false;
    *u = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex(p_[i]);
      if (h < 0) return false;
      *u = *u * 16 + static_cast<unsigned>(h);
    }
    p_ += 4;
    return true;
  }
  static void utf8(unsigned c, std::string* out) {
    if (c < 0x80) {
      *out += static_cast<char>(c);
    } else if (c < 0x800) {
      *out += static_cast<char>(0xC0 | (c >> 6));
      *out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      *out += static_cast<char>(0xE0 | (c >> 12));
      *out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (c >> 18));
      *out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }

  // A string at p_ (its opening quote), decoded into *out when out is given; *exact turns false for a
  // lone surrogate (no UTF-8 field name can equal it).
  bool string(std::string* out, bool* exact) {
    if (!more() || *p_ != '"') return failed("expected a string");
    ++p_;
    for (;;) {
      if (!more()) return failed("unterminated string");
      const char c = *p_++;
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return failed("a control character in a string");
      if (c != '\\') {
        if (out) *out += c;
        continue;
      }
      if (!more()) return failed("unterminated string");
      const char e = *p_++;
      const char* simple = "\"\\/bfnrt";
      const char* decoded = "\"\\/\b\f\n\r\t";
      bool done = false;
      for (int i = 0; simple[i]; ++i)
        if (e == simple[i]) {
          if (out) *out += decoded[i];
          done = true;
        }
      if (done) continue;
      if (e != 'u') return failed("an invalid escape in a string");
      unsigned u = 0;
      if (!hex4(&u)) return failed("an invalid \\u escape");
      if (u >= 0xD800 && u < 0xDC00 && end_ - p_ >= 6 && p_[0] == '\\' && p_[1] == 'u') {
        const char* save = p_;
        p_ += 2;
        unsigned low = 0;
        if (hex4(&low) && low >= 0xDC00 && low < 0xE000) {
          u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
        } else {
          p_ = save;  // not a pair: the high surrogate stands alone
        }
      }
      if (u >= 0xD800 && u < 0xE000) {
        if (exact) *exact = false;
        continue;
      }
      if (out) utf8(u, out);
    }
  }

  bool literal(const char* word) {
    const char* q = p_;
    for (; *word; ++word, ++q)
      if (q >= end_ || *q != *word) return false;
    p_ = q;
    return true;
  }

  bool digits() {
    const char* start = p_;
    while (more() && *p_ >= '0' && *p_ <= '9') ++p_;
    return p_ > start;
  }

  bool number() {
    if (more() && *p_ == '-') {
      ++p_;
      if (literal("Infinity")) return true;
    }
    if (!more() || *p_ < '0' || *p_ > '9') return failed("expected a value");
    if (*p_ == '0') {
      ++p_;
    } else {
      digits();
    }
    if (more() && *p_ == '.') {
      ++p_;
      if (!digits()) return failed("a number without digits after its point");
    }
    if (more() && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (more() && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digits()) return failed("a number without digits in its exponent");
    }
    return true;
  }

  bool skip_value(int depth) {
    if (depth > kMaxDepth) return failed("nested more than 512 deep");
    if (!more()) return failed("expected a value");
    switch (*p_) {
      case '"':
        return string(nullptr, nullptr);
      case '{':
      case '[': {
        const char close = *p_ == '{' ? '}' : ']';
        ++p_;
        space();
        if (more() && *p_ == close) {
          ++p_;
          return true;
        }
        for (;;) {
          space();
          if (close == '}') {
            if (!string(nullptr, nullptr)) return false;
            space();
            if (!more() || *p_ != ':') return failed("expected ':' after a key");
            ++p_;
            space();
          }
          if (!skip_value(depth + 1)) return false;
          space();
          if (!more()) return failed("unterminated object or array");
          if (*p_ == ',') {
            ++p_;
            continue;
          }
          if (*p_ != close) return failed(close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
          ++p_;
          return true;
        }
      }
      default:
        if (literal("true") || literal("false") || literal("null") || literal("NaN") || literal("Infinity")) return true;
        return number();
    }
  }

  // The value in [a, b) as a non-negative int64, or why not.
  static std::string integer(const char* a, const char* b, int64_t* value) {
    const std::string text(a, static_cast<size_t>(b - a));
    if (text.empty() || text[0] == '-') return quoted_bytes(text, 32) + ": a label must be a non-negative integer";
    int64_t v = 0;
    for (char c : text) {
      if (c < '0' || c > '9') return quoted_bytes(text, 32) + ": a label must be a non-negative integer";
      if (v > (INT64_MAX - (c - '0')) / 10) return quoted_bytes(text, 32) + ": out of range";
      v = v * 10 + (c - '0');
    }
    *value = v;
    return "";
  }

  const char* p_;
  const char* end_;
  std::string error_;
};

}  // namespace

std::string json_integer_field(const char* data, size_t size, const std::string& field, int64_t* value) {
  return Parser(data, size).field(field, value);
}

}  // namespace fastpipe
