// How a column's records are read: one enum and one name per mode, shared by the engine, its
// statistics and the Python API (fastpipe._C.IO_MODES).
#pragma once

#include <string>

#include "core/error.h"

namespace fastpipe {

enum class IoMode {
  kAuto,    // the engine decides per column (choose_mode in gather.h); never a file's mode
  kMmap,    // gathered from a shared read-only mapping
  kPread,   // pread(2) through the page cache, sequential runs coalesced
  kDirect,  // O_DIRECT pread, bypassing the page cache
};

struct IoModeName {
  IoMode mode;
  const char* name;
};
inline constexpr IoModeName kIoModes[] = {
    {IoMode::kAuto, "auto"}, {IoMode::kMmap, "mmap"}, {IoMode::kPread, "pread"}, {IoMode::kDirect, "direct"}};

inline const char* io_mode_name(IoMode m) {
  for (const auto& e : kIoModes)
    if (e.mode == m) return e.name;
  return "?";
}

inline IoMode parse_io_mode(const std::string& name) {
  std::string known;
  for (const auto& e : kIoModes) {
    if (name == e.name) return e.mode;
    known += std::string(known.empty() ? "'" : ", '") + e.name + "'";
  }
  throw Error(ErrorKind::kValue, "io must be one of " + known + ", got '" + name + "'");
}

}  // namespace fastpipe
