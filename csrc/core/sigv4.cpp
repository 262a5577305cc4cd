#include "core/sigv4.h"

#include <algorithm>
#include <cctype>
#include <ctime>

#include "core/sha256.h"

namespace fastpipe {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Leading and trailing spaces off, inner runs of spaces one space (the canonical header value).
std::string trimmed(const std::string& v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

}  // namespace

std::string uri_encode(const std::string& s, bool keep_slash) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += char(c);
    } else {
      out += '%';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out;
}

std::string amz_date_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc;
  gmtime_r(&now, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &utc);
  return buf;
}

std::vector<HttpHeader> sigv4_sign(const std::string& method, const std::string& path,
                                   const std::vector<HttpHeader>& headers, const std::string& region,
                                   const AwsCredentials& credentials, const std::string& amz_date,
                                   const std::string& payload_hash) {
  static const std::string kEmptyHash = to_hex(sha256(""));
  const std::string& body_hash = payload_hash.empty() ? kEmptyHash : payload_hash;
  std::vector<HttpHeader> added = {{"x-amz-content-sha256", body_hash}, {"x-amz-date", amz_date}};
  if (!credentials.session_token.empty()) added.push_back({"x-amz-security-token", credentials.session_token});
  std::vector<HttpHeader> signed_headers;
  for (const auto& h : headers) signed_headers.push_back({lower(h.name), trimmed(h.value)});
  signed_headers.insert(signed_headers.end(), added.begin(), added.end());
  std::sort(signed_headers.begin(), signed_headers.end(),
            [](const HttpHeader& a, const HttpHeader& b) { return a.name < b.name; });
  std::string canonical_headers, names;
  for (const auto& h : signed_headers) {
    canonical_headers += h.name + ":" + h.value + "\n";
    names += (names.empty() ? "" : ";") + h.name;
  }
  const std::string canonical_request =
      method + "\n" + path + "\n\n" + canonical_headers + "\n" + names + "\n" + body_hash;
  const std::string day = amz_date.substr(0, 8);
  const std::string scope = day + "/" + region + "/s3/aws4_request";
  const std::string to_sign =
      "AWS4-HMAC-SHA256\n" + amz_date + "\n" + scope + "\n" + to_hex(sha256(canonical_request));
  std::string key = as_bytes(hmac_sha256("AWS4" + credentials.secret_key, day));
  for (const char* part : {region.c_str(), "s3", "aws4_request"}) key = as_bytes(hmac_sha256(key, part));
  added.push_back({"Authorization", "AWS4-HMAC-SHA256 Credential=" + credentials.access_key + "/" + scope +
                                        ", SignedHeaders=" + names +
                                        ", Signature=" + to_hex(hmac_sha256(key, to_sign))});
  return added;
}

}  // namespace fastpipe
