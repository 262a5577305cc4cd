#include "core/record_source.h"

#include "core/file.h"

namespace fastpipe {

std::unique_ptr<RecordSource> open_record_source(const std::string& path, IoMode mode, bool random_access) {
  return std::make_unique<File>(path, mode, random_access);
}

}  // namespace fastpipe
