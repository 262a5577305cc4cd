// Named ranges around the engine's stages, for profilers the engine cannot link (it has no torch or
// CUDA headers): csrc/ops installs NVTX on CUDA builds, so the reader threads' reads show in Nsight
// Systems. Without hooks a range costs one atomic load.
#pragma once

namespace fastpipe::trace {

struct Hooks {
  void (*push)(const char* name);
  void (*pop)();
};

// Installs `hooks` for ranges opened from now on (null: none). The pointer must stay valid.
void install(const Hooks* hooks);
const Hooks* installed();

class Range {
 public:
  explicit Range(const char* name) : hooks_(installed()) {
    if (hooks_) hooks_->push(name);
  }
  ~Range() {
    if (hooks_) hooks_->pop();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  const Hooks* hooks_;
};

}  // namespace fastpipe::trace
