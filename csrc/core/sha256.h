// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104): what AWS Signature Version 4 needs, without a crypto
// library (the build needs only libcurl for remote shards). Tested against hashlib/hmac.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fastpipe {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  Digest finish();  // the object is spent afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t fill_ = 0;
  uint64_t total_ = 0;
};

Digest sha256(const std::string& data);
Digest hmac_sha256(const std::string& key, const std::string& message);
std::string to_hex(const Digest& d);
inline std::string as_bytes(const Digest& d) { return std::string(d.begin(), d.end()); }

}  // namespace fastpipe
