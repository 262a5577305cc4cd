#include "core/trace.h"

#include <atomic>

namespace fastpipe::trace {
namespace {
std::atomic<const Hooks*> hooks{nullptr};
}  // namespace

void install(const Hooks* h) { hooks.store(h, std::memory_order_release); }

const Hooks* installed() { return hooks.load(std::memory_order_acquire); }

}  // namespace fastpipe::trace
