// How a column's records are read: one enum and one name per mode, shared by the engine, its
// statistics and the Python API (fastpipe._C.ReaderConfig's io).
#pragma once

#include "core/choices.h"

namespace fastpipe {

enum class IoMode {
  kAuto,    // the engine decides per column (choose_mode in gather.h); never a file's mode
  kMmap,    // gathered from a shared read-only mapping
  kPread,   // pread(2) through the page cache, sequential runs coalesced
  kDirect,  // O_DIRECT pread, bypassing the page cache
};

template <>
struct Choices<IoMode> {
  static constexpr Named<IoMode> names[] = {
      {IoMode::kAuto, "auto"}, {IoMode::kMmap, "mmap"}, {IoMode::kPread, "pread"}, {IoMode::kDirect, "direct"}};
};

}  // namespace fastpipe
