// Parsing and validation of numpy .npy headers (format versions 1.0, 2.0, 3.0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fastpipe {

struct NpyHeader {
  int major = 0;
  int minor = 0;
  std::string descr;   // as written, e.g. "<f4"
  std::string dtype;   // canonical numpy name, e.g. "float32"
  int itemsize = 0;
  std::vector<int64_t> shape;
  int64_t data_offset = 0;  // first byte of the array data
  int64_t data_bytes = 0;   // prod(shape) * itemsize
  int64_t file_size = 0;
};

// Reads and validates the header of `path`. Throws Error(kValue) naming the file and the defect, or
// Error(kIO) when the file cannot be opened or read.
NpyHeader read_npy_header(const std::string& path);

// Validates a header held in memory: `buf` holds the first `len` bytes of a file of `file_size` bytes.
// `path` is only used in messages. Exposed separately so the parser can be fuzzed.
NpyHeader parse_npy_header(const char* buf, size_t len, int64_t file_size, const std::string& path);

}  // namespace fastpipe
