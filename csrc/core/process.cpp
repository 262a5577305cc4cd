#include "core/process.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace fastpipe {
namespace {

std::atomic<pid_t> cached{0};

void refresh() { cached.store(::getpid(), std::memory_order_relaxed); }

}  // namespace

pid_t current_pid() {
  // Registered before the first value is read: a fork after it runs the handler in the child.
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, refresh);
    refresh();
    return true;
  }();
  (void)registered;
  return cached.load(std::memory_order_relaxed);
}

}  // namespace fastpipe
