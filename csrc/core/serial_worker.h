// A thread of its own that runs posted tasks one at a time, in order, and keeps each one's outcome in a
// ticket that others wait on. The device pipeline's submitter (core/device_pipeline.h): the decoder's
// host-side work queued off the training thread.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace fastpipe {

class SerialWorker {
 public:
  struct Ticket;

  SerialWorker();
  // Runs what was posted, then joins (stop()); in a forked child, where the thread does not exist, the
  // handle is abandoned.
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `task`; what it throws is kept in its ticket. The task is destroyed before its ticket is done.
  std::shared_ptr<Ticket> post(std::function<void()> task);
  // Waits until the ticket's task has run: in 50 ms steps with `poll` between them (a signal raises from
  // it), Error(kTimeout) naming `what` after timeout_s seconds (> 0). Returns what the task threw.
  std::exception_ptr wait(const Ticket& t, double timeout_s, const std::function<void()>& poll, const std::string& what);
  // Until every posted task has run.
  void wait_idle();
  // Runs what was posted, then ends the thread.
  void stop();

 private:
  void loop();

  pid_t owner_pid_;
  std::mutex mu_;
  std::condition_variable posted_, ran_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Ticket>>> tasks_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace fastpipe
