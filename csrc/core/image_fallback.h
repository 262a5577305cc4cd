// The decoder of last resort for an image column: formats without a decoder here (BMP, GIF, TIFF, PNM,
// animated WebP, ...), and PNGs or WebPs that this build cannot decode or whose decode failed. The
// Python layer gives Pillow (csrc/ops/pillow_decoder.cpp), so that a file torchvision's ImageFolder
// reads is read here too; it holds the GIL for that record only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastpipe {

class FallbackDecoder {
 public:
  virtual ~FallbackDecoder() = default;

  // The whole image as RGB (*height x *width x 3 into *rgb). Throws std::runtime_error with why not.
  void decode(const uint8_t* data, size_t size, std::vector<uint8_t>* rgb, int* height, int* width) const {
    decode_rgb(data, size, rgb, height, width);
    decoded_.fetch_add(1, std::memory_order_relaxed);
  }
  // Images decoded so far (stats()).
  int64_t decoded() const { return decoded_.load(std::memory_order_relaxed); }

 protected:
  virtual void decode_rgb(const uint8_t* data, size_t size, std::vector<uint8_t>* rgb, int* height,
                          int* width) const = 0;

 private:
  mutable std::atomic<int64_t> decoded_{0};
};

}  // namespace fastpipe
