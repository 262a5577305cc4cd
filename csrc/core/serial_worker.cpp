#include "core/serial_worker.h"

#include <unistd.h>

#include <chrono>

#include "core/error.h"

namespace fastpipe {

struct SerialWorker::Ticket {
  bool done = false;  // guarded by the worker's mu_
  std::exception_ptr error;
};

SerialWorker::SerialWorker() : owner_pid_(getpid()), thread_([this] { loop(); }) {}

SerialWorker::~SerialWorker() {
  if (getpid() != owner_pid_) {
    new std::thread(std::move(thread_));  // forked child: as the reader threads (batch_reader.cpp)
    return;
  }
  stop();
}

void SerialWorker::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    posted_.wait(lk, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;
    auto [task, ticket] = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
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
    busy_ = false;
    ran_.notify_all();
  }
}

std::shared_ptr<SerialWorker::Ticket> SerialWorker::post(std::function<void()> task) {
  auto ticket = std::make_shared<Ticket>();
  {
    std::lock_guard<std::mutex> lk(mu_);
    tasks_.emplace_back(std::move(task), ticket);
  }
  posted_.notify_one();
  return ticket;
}

std::exception_ptr SerialWorker::wait(const Ticket& t, double timeout_s, const std::function<void()>& poll,
                                      const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  while (!t.done) {
    if (ran_.wait_for(lk, std::chrono::milliseconds(50)) == std::cv_status::no_timeout) continue;
    lk.unlock();
    if (poll) poll();
    if (timeout_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s)
      throw Error(ErrorKind::kTimeout, what + " did not happen within timeout=" + std::to_string(timeout_s) + " s");
    lk.lock();
  }
  return t.error;
}

void SerialWorker::wait_idle() {
  std::unique_lock<std::mutex> lk(mu_);
  ran_.wait(lk, [&] { return tasks_.empty() && !busy_; });
}

void SerialWorker::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  posted_.notify_all();
  thread_.join();
}

}  // namespace fastpipe
