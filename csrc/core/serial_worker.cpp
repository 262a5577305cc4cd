#include "core/serial_worker.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "core/error.h"
#include "core/process.h"

namespace fastpipe {

struct SerialWorker::Ticket {
  bool done = false;  // guarded by the queue's mu
  std::exception_ptr error;
};

struct SerialWorker::Queue {
  std::mutex mu;
  std::condition_variable posted, ran;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<Ticket>>> tasks;
  bool busy = false;
  bool stopping = false;
  bool ended = false;  // the thread has left its loop

  void loop() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      posted.wait(lk, [&] { return stopping || !tasks.empty(); });
      if (tasks.empty()) break;
      auto [task, ticket] = std::move(tasks.front());
      tasks.pop_front();
      busy = true;
      lk.unlock();
      std::exception_ptr error;
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      task = nullptr;  // what it holds (a host batch) is let go before its ticket is done
      lk.lock();
      ticket->error = error;
      ticket->done = true;
      busy = false;
      ran.notify_all();
    }
    ended = true;
    ran.notify_all();
  }

  // Waits with mu held (lk) until done(): in 50 ms steps, poll() between them without the lock, and
  // Error(kTimeout) naming `what` after timeout_s (> 0).
  template <typename Done>
  void wait(std::unique_lock<std::mutex>& lk, Done done, double timeout_s, const std::function<void()>& poll,
            const std::string& what) {
    const auto start = std::chrono::steady_clock::now();
    while (!done()) {
      if (ran.wait_for(lk, std::chrono::milliseconds(50)) == std::cv_status::no_timeout) continue;
      lk.unlock();
      if (poll) poll();
      if (timeout_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s)
        throw Error(ErrorKind::kTimeout, what + " did not happen within timeout=" + std::to_string(timeout_s) + " s");
      lk.lock();
    }
  }
};

SerialWorker::SerialWorker() : owner_pid_(current_pid()), queue_(std::make_shared<Queue>()) {
  thread_ = std::thread([queue = queue_] { queue->loop(); });
}

SerialWorker::~SerialWorker() {
  if (current_pid() != owner_pid_) {
    new std::thread(std::move(thread_));  // forked child: as the reader threads (batch_reader.cpp)
    return;
  }
  try {
    stop(kTeardownSeconds, nullptr);
  } catch (const std::exception&) {  // left behind: it holds what it uses
  }
}

std::shared_ptr<SerialWorker::Ticket> SerialWorker::post(std::function<void()> task) {
  auto ticket = std::make_shared<Ticket>();
  {
    std::lock_guard<std::mutex> lk(queue_->mu);
    if (queue_->stopping)
      throw Error(ErrorKind::kState, "work posted to a stopped submitter thread would never run (the loader is closed)");
    queue_->tasks.emplace_back(std::move(task), ticket);
  }
  queue_->posted.notify_one();
  return ticket;
}

std::exception_ptr SerialWorker::wait(const Ticket& t, double timeout_s, const std::function<void()>& poll,
                                      const std::string& what) {
  std::unique_lock<std::mutex> lk(queue_->mu);
  queue_->wait(lk, [&] { return t.done; }, timeout_s, poll, what);
  return t.error;
}

void SerialWorker::wait_idle(double timeout_s, const std::function<void()>& poll, const std::string& what) {
  Queue& q = *queue_;
  std::unique_lock<std::mutex> lk(q.mu);
  q.wait(lk, [&] { return q.tasks.empty() && !q.busy; }, timeout_s, poll, what);
}

bool SerialWorker::stop(double timeout_s, const std::function<void()>& poll) {
  if (!thread_.joinable()) return true;
  Queue& q = *queue_;
  {
    std::lock_guard<std::mutex> lk(q.mu);
    q.stopping = true;
  }
  q.posted.notify_all();
  try {
    std::unique_lock<std::mutex> lk(q.mu);
    q.wait(lk, [&] { return q.ended; }, timeout_s, poll, "the submitter thread's end");
  } catch (const Error& e) {
    thread_.detach();
    if (e.kind() != ErrorKind::kTimeout) throw;
    return false;
  } catch (...) {  // what poll raised (an interrupt)
    thread_.detach();
    throw;
  }
  thread_.join();
  return true;
}

}  // namespace fastpipe
