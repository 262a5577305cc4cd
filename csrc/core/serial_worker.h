// A thread of its own that runs posted tasks one at a time, in order, and keeps each one's outcome in a
// ticket that others wait on. The device pipeline's submitter (core/device_pipeline.h): the decoder's
// host-side work queued off the training thread.
//
// Every wait ends: each takes a timeout and a `poll` called every 50 ms (a pending signal raises from
// it). A thread stuck in a task (a driver call that never returns) can be left behind by stop(): it
// owns what it uses (the worker's queue here, and what its task holds), so it may return later safely.
#pragma once

#include <sys/types.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace fastpipe {

class SerialWorker {
 public:
  struct Ticket;

  SerialWorker();
  // stop(kTeardownSeconds, no poll); in a forked child, where the thread does not exist, the handle is
  // abandoned.
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `task`; what it throws is kept in its ticket. The task is destroyed before its ticket is done.
  // Error(kState) after stop(): nothing would run it.
  std::shared_ptr<Ticket> post(std::function<void()> task);
  // Waits until the ticket's task has run: in 50 ms steps with `poll` between them (a signal raises from
  // it), Error(kTimeout) naming `what` after timeout_s seconds (> 0). Returns what the task threw.
  std::exception_ptr wait(const Ticket& t, double timeout_s, const std::function<void()>& poll, const std::string& what);
  // Until every posted task has run, waiting as wait() does.
  void wait_idle(double timeout_s, const std::function<void()>& poll, const std::string& what);
  // Runs what was posted, then ends the thread: waits for it as wait() does. True when it ended and was
  // joined; after timeout_s (> 0) the thread is left to end on its own (detached) and false is returned;
  // what poll throws is rethrown after the thread is left so.
  bool stop(double timeout_s, const std::function<void()>& poll);

  // How long the destructor waits for a task still running before it leaves the thread behind.
  static constexpr double kTeardownSeconds = 60.0;

 private:
  struct Queue;
  pid_t owner_pid_;
  std::shared_ptr<Queue> queue_;  // shared with the thread, which may outlive this object (stop())
  std::thread thread_;
};

}  // namespace fastpipe
