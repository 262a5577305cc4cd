#include "core/shard_stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>

#include "core/error.h"
#include "core/object_blocks.h"
#include "core/process.h"
#include "core/shard_stream_state.h"

namespace fastpipe {

// A reader waiting for a shard or a part of it: counted in blocked_seconds while it lasts, so that a stall
// shows as it happens (with the lock held).
struct ShardStream::Waiting {
  ShardStream* stream;
  bool on = false;
  void start() {
    if (on) return;
    stream->count_waits(+1);
    on = true;
  }
  ~Waiting() {
    if (on) stream->count_waits(-1);
  }
};

// An open shard as the reader sees it: reads go to the cache file (while it arrives: once the bytes they
// need are written); the shard stays until this is gone.
class ShardStream::Pinned final : public RecordSource {
 public:
  Pinned(ShardStream* stream, int32_t k, std::shared_ptr<RecordSource> file, bool arriving)
      : stream_(stream), k_(k), file_(std::move(file)), complete_(!arriving) {}
  ~Pinned() override { stream_->release(k_); }
  const std::string& path() const override { return file_->path(); }
  IoMode mode() const override { return file_->mode(); }
  const std::string& fallback_reason() const override { return file_->fallback_reason(); }
  int64_t size_at_open() const override { return file_->size_at_open(); }
  int64_t mtime_ns_at_open() const override { return file_->mtime_ns_at_open(); }
  int64_t current_size() const override { return file_->current_size(); }
  int64_t read_at_most(void* dst, int64_t len, int64_t offset) const override {
    arrived(offset, len);
    return file_->read_at_most(dst, len, offset);
  }
  bool visit_mapped(const int64_t* offsets, int64_t count, int64_t len, MappedVisitor fn, void* ctx,
                    int64_t* done) const override {
    for (int64_t i = 0; i < count; ++i) arrived(offsets[i], len);
    return file_->visit_mapped(offsets, count, len, fn, ctx, done);
  }
  void will_need(int64_t offset, int64_t len) const override { file_->will_need(offset, len); }
  void populate(int64_t offset, int64_t len) const override { file_->populate(offset, len); }

 private:
  void arrived(int64_t offset, int64_t len) const {
    if (!complete_.load(std::memory_order_acquire) && stream_->await(k_, offset, len))
      complete_.store(true, std::memory_order_release);
  }

  ShardStream* stream_;
  int32_t k_;
  std::shared_ptr<RecordSource> file_;
  mutable std::atomic<bool> complete_;
};

ShardStream::ShardStream(std::vector<RemoteObject> objects, RemoteAuth auth, TransferOptions options,
                         std::string dir, int64_t limit, FunctionRef<void()> check)
    : objects_(std::move(objects)), auth_(auth), options_(options), dir_(std::move(dir)), limit_(limit),
      owner_pid_(current_pid()), http_(std::make_unique<HttpTransfers>(std::move(auth), options)) {
  make_cache_dir(dir_);
  infos_ = http_->head(objects_, check);
  start();
}

ShardStream::ShardStream(std::vector<RemoteObject> objects, std::vector<ObjectInfo> infos, RemoteAuth auth,
                         TransferOptions options, std::string dir, int64_t limit)
    : objects_(std::move(objects)), infos_(std::move(infos)), auth_(auth), options_(options),
      dir_(std::move(dir)), limit_(limit), owner_pid_(current_pid()),
      http_(std::make_unique<HttpTransfers>(std::move(auth), options)) {
  start();
}

void ShardStream::start() {
  for (size_t k = 0; k < objects_.size(); ++k) {
    files_.push_back(cache_file_name(objects_[k].name, infos_[k]));
    shard_of_file_.emplace(files_.back(), int32_t(k));
    if (limit_ >= 0 && infos_[k].size > limit_)
      throw Error(ErrorKind::kValue, "cache_limit is " + bytes_text(limit_) + " but the shard '" + objects_[k].name +
                                         "' alone is " + bytes_text(infos_[k].size) + " (raise cache_limit)");
  }
  shards_.resize(objects_.size());
  for (size_t k = 0; k < shards_.size(); ++k)
    shards_[k].present = cache_file_complete(dir_ + "/" + files_[k], infos_[k].size);
  stats_.transfer = http_->stats();
  last_open_ = Clock::now();
  thread_ = std::thread([this] { run(); });
}

std::shared_ptr<ShardStream> ShardStream::blocks(const std::vector<int32_t>& shard, const std::vector<int64_t>& begin,
                                                 const std::vector<int64_t>& end) const {
  check_process();
  ObjectBlocks b = object_blocks(objects_, infos_, shard, begin, end);
  return std::shared_ptr<ShardStream>(
      new ShardStream(std::move(b.objects), std::move(b.infos), auth_, options_, dir_, limit_));
}

ShardStream::~ShardStream() {
  if (current_pid() != owner_pid_) {
    // A forked child: the fetch thread and the transfers' connections are the parent's; joining would
    // wait forever and closing them could disturb the parent's. Abandoned on purpose.
    new std::thread(std::move(thread_));
    (void)http_.release();
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  fetch_cv_.notify_all();
  ready_cv_.notify_all();
  thread_.join();
}

void ShardStream::check_process() const {
  if (current_pid() != owner_pid_)
    throw Error(ErrorKind::kState, "this remote WebDataset was made in another process (before a fork), whose "
                                   "fetch thread it cannot use here: make the WebDataset in this process");
}

std::vector<std::string> ShardStream::paths() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(dir_ + "/" + f);
  return out;
}

void ShardStream::plan(const std::vector<int32_t>& order, const std::vector<int64_t>& reads,
                       const std::vector<int32_t>& next, const std::vector<int32_t>& need_shard,
                       const std::vector<int64_t>& need_begin, const std::vector<int64_t>& need_end) {
  check_process();
  FP_CHECK_VALUE(reads.size() == shards_.size(), "a stream's plan needs one read count per shard");
  for (const auto* list : {&order, &next, &need_shard})
    for (int32_t k : *list)
      FP_CHECK_VALUE(k >= 0 && size_t(k) < shards_.size(), "a stream's plan names shard " + std::to_string(k) +
                                                               " of " + std::to_string(shards_.size()));
  FP_CHECK_VALUE(need_begin.size() == need_shard.size() && need_end.size() == need_shard.size(),
                 "a stream's plan needs a begin and an end for each range it names");
  for (size_t i = 0; i < need_shard.size(); ++i)
    FP_CHECK_VALUE(0 <= need_begin[i] && need_begin[i] <= need_end[i] && need_end[i] <= infos_[need_shard[i]].size,
                   "a stream's plan names bytes [" + std::to_string(need_begin[i]) + ", " +
                       std::to_string(need_end[i]) + ") of shard " + std::to_string(need_shard[i]) + ", which has " +
                       std::to_string(infos_[need_shard[i]].size));
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t k = 0; k < shards_.size(); ++k) {
    shards_[k].rank = shards_[k].next_rank = kNotPlanned;
    shards_[k].reads_left = std::max<int64_t>(0, reads[k]);
    shards_[k].seen = shards_[k].waited = false;
  }
  plan_.clear();
  next_.clear();
  last_open_ = Clock::now();  // a new pass: its readers have not started
  for (int32_t k : order) {
    if (shards_[k].rank != kNotPlanned) continue;
    shards_[k].rank = int64_t(plan_.size());
    plan_.push_back(k);
  }
  for (int32_t k : next) {
    if (shards_[k].next_rank != kNotPlanned) continue;
    shards_[k].next_rank = int64_t(next_.size());
    next_.push_back(k);
  }
  // The parts in the order the pass first reads them: the ranges named, then the rest of each shard.
  queue_.clear();
  cursor_ = 0;
  std::vector<std::vector<bool>> listed(shards_.size());
  auto list = [&](int32_t k, int64_t begin, int64_t end) {
    const int64_t span = part_span(infos_[k], options_.part_bytes), size = infos_[k].size;
    if (end <= begin || shards_[k].rank == kNotPlanned) return;
    if (listed[k].empty()) listed[k].assign(size_t((size + span - 1) / span), false);
    for (int64_t p = begin / span; p < (end + span - 1) / span; ++p)
      if (!listed[k][size_t(p)]) listed[k][size_t(p)] = true, queue_.emplace_back(k, p);
  };
  for (size_t i = 0; i < need_shard.size(); ++i) list(need_shard[i], need_begin[i], need_end[i]);
  for (int32_t k : plan_) list(k, 0, infos_[k].size);
  poke();
}

// With the lock held: shard k opened from the cache, under its shared lock; false when it is not there
// (not fetched yet, or evicted by another process).
bool ShardStream::open_from_disk(int32_t k) {
  Shard& s = shards_[k];
  if (s.source) return true;
  const std::string path = dir_ + "/" + files_[k];
  if (!cache_file_complete(path, infos_[k].size)) return s.present = false;
  Fd lock = lock_shared(dir_, files_[k]);
  std::shared_ptr<RecordSource> file;
  try {
    file = open_record_source(path, IoMode::kPread);
  } catch (const Error&) {
    return s.present = false;  // evicted between the two calls
  }
  if (file->size_at_open() != infos_[k].size) return s.present = false;
  s.source = std::move(file);
  s.lock = std::move(lock);
  return s.present = true;
}

void ShardStream::demand(int32_t k) {
  Shard& s = shards_[k];
  if (s.demanded) return;
  s.demanded = true;
  demanded_.push_back(k);
  poke();
}

void ShardStream::poke() {
  ++pokes_;
  fetch_cv_.notify_one();
  http_->wake();
}

std::unique_ptr<RecordSource> ShardStream::open(int32_t k) {
  check_process();
  FP_CHECK_VALUE(k >= 0 && size_t(k) < shards_.size(), "shard " + std::to_string(k) + " is out of range");
  std::unique_lock<std::mutex> lk(mu_);
  Shard& s = shards_[k];
  bool waited = false;
  Waiting waiting{this};
  std::shared_ptr<RecordSource> file;
  bool arriving = false;
  for (;;) {
    if (!s.failed.empty()) throw Error(ErrorKind::kIO, s.failed);
    if (open_from_disk(k)) {
      file = s.source;
      break;
    }
    if (s.download) {  // on its way: its reads wait for their parts
      file = s.download->reader;
      arriving = true;
      break;
    }
    waited = true;
    waiting.start();
    demand(k);
    wait_for_shard(lk, k);
  }
  s.demanded = false;
  if (!s.seen && !waited) ++stats_.counts.hits;
  s.seen = true;
  ++s.pins;
  if (s.reads_left > 0) --s.reads_left;
  s.last_use = ++clock_;
  last_open_ = Clock::now();
  return std::make_unique<Pinned>(this, k, std::move(file), arriving);
}

bool ShardStream::await(int32_t k, int64_t offset, int64_t len) {
  std::unique_lock<std::mutex> lk(mu_);
  Shard& s = shards_[k];
  Waiting waiting{this};
  for (;;) {
    if (!s.failed.empty()) throw Error(ErrorKind::kIO, s.failed);
    if (!s.download) return true;  // a fetch ends complete or failed
    const Download& d = *s.download;
    const int64_t end = std::min(infos_[k].size, offset + std::max<int64_t>(len, 0));
    bool all = true;
    if (offset < end) {
      const auto [first, last] = d.parts_of(offset, end);
      for (int64_t p = first; p < last; ++p) {
        if (d.parts[size_t(p)] == kWritten) continue;
        all = false;
        if (d.parts[size_t(p)] == kWanted && !waiting.on) urgent_.emplace_back(k, p);
      }
    }
    if (all) return false;
    if (!waiting.on) poke();
    waiting.start();
    wait_for_shard(lk, k);
  }
}

void ShardStream::wait_for_shard(std::unique_lock<std::mutex>& lk, int32_t k) {
  ready_cv_.wait_for(lk, kPoll);
  if (stop_)
    throw Error(ErrorKind::kIO, "the dataset was closed while its shard '" + objects_[k].name + "' was fetched");
  if (!shards_[k].failed.empty()) return;  // the caller says why
  lk.unlock();
  const bool cancelled = source_wait_cancelled();
  lk.lock();
  if (cancelled) throw Error(ErrorKind::kIO, "stopped while waiting for the shard '" + objects_[k].name + "'");
}

void ShardStream::release(int32_t k) {
  std::lock_guard<std::mutex> lk(mu_);
  Shard& s = shards_[k];
  if (s.pins == 0 || --s.pins > 0) return;
  s.source.reset();
  s.lock.reset();
  if (limit_ >= 0) poke();  // it may be evicted now, to make room
}

void ShardStream::pin(const std::vector<int32_t>& ks, FunctionRef<void()> check) {
  check_process();
  std::unique_lock<std::mutex> lk(mu_);
  for (int32_t k : ks)
    FP_CHECK_VALUE(k >= 0 && size_t(k) < shards_.size(), "shard " + std::to_string(k) + " is out of range");
  size_t done = 0;
  try {
    for (; done < ks.size(); ++done) {
      const int32_t k = ks[done];
      while (shards_[k].failed.empty() && !open_from_disk(k)) {
        for (size_t j = done; j < ks.size(); ++j) demand(ks[j]);  // all at once: fetched together
        ready_cv_.wait_for(lk, kPoll);
        lk.unlock();
        check();
        lk.lock();
      }
      if (!shards_[k].failed.empty()) throw Error(ErrorKind::kIO, shards_[k].failed);
      shards_[k].demanded = false;
      ++shards_[k].pins;
    }
  } catch (...) {
    lk.unlock();
    unpin(std::vector<int32_t>(ks.begin(), ks.begin() + static_cast<std::ptrdiff_t>(done)));
    throw;
  }
}

void ShardStream::unpin(const std::vector<int32_t>& ks) {
  for (int32_t k : ks)
    if (k >= 0 && size_t(k) < shards_.size()) release(k);
}

// With the lock held: `delta` more readers wait; the time waited so far is integrated first.
void ShardStream::count_waits(int delta) {
  const auto now = Clock::now();
  stats_.blocked_seconds += waiting_ * std::chrono::duration<double>(now - waits_mark_).count();
  waits_mark_ = now;
  waiting_ += delta;
}

StreamStats ShardStream::stats() const {
  check_process();
  std::lock_guard<std::mutex> lk(mu_);
  StreamStats out = stats_;
  out.fetching = int64_t(downloading_.size());
  out.blocked_seconds += waiting_ * std::chrono::duration<double>(Clock::now() - waits_mark_).count();
  return out;
}

}  // namespace fastpipe
