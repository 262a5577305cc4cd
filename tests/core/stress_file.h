// The data file of the native stress tests: a header of kHeader bytes, then kRecords records of
// kRecordBytes whose byte k of record r is expected_byte(r, k), so that any wrong byte shows.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace stress {

constexpr int64_t kRecords = 997;
constexpr int64_t kRecordBytes = 13;
constexpr int64_t kHeader = 17;

inline uint8_t expected_byte(int64_t record, int64_t k) { return static_cast<uint8_t>(record * 31 + k * 7 + 1); }

inline std::string write_file() {
  char path[] = "/tmp/fastpipe_stressXXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) std::abort();
  std::vector<uint8_t> data(kHeader + kRecords * kRecordBytes, 0xEE);
  for (int64_t r = 0; r < kRecords; ++r)
    for (int64_t k = 0; k < kRecordBytes; ++k) data[kHeader + r * kRecordBytes + k] = expected_byte(r, k);
  if (write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) std::abort();
  close(fd);
  return path;
}

}  // namespace stress
