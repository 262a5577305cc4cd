#include "core/record_source.h"

#include "core/file.h"

namespace fastpipe {

std::unique_ptr<RecordSource> open_record_source(const std::string& path, IoMode mode, bool random_access) {
  return std::make_unique<File>(path, mode, random_access);
}

namespace {
thread_local const FunctionRef<bool()>* t_cancel = nullptr;
}  // namespace

SourceWaitCancel::SourceWaitCancel(FunctionRef<bool()> stopped) : previous_(t_cancel), stopped_(stopped) {
  t_cancel = &stopped_;
}

SourceWaitCancel::~SourceWaitCancel() { t_cancel = previous_; }

bool source_wait_cancelled() { return t_cancel != nullptr && (*t_cancel)(); }

}  // namespace fastpipe
