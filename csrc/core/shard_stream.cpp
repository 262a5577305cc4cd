#include "core/shard_stream.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "core/error.h"
#include "core/object_blocks.h"

namespace fastpipe {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr int64_t kNotPlanned = std::numeric_limits<int64_t>::max();
// No shard opened this long while a reader waits: the readers wait on each other (an order the plan did
// not foresee). Not shorter: on a loaded machine one record can take a second, and evicting a shard the
// pass still reads costs a refetch.
constexpr auto kStuck = std::chrono::seconds(5);

}  // namespace

struct ShardStream::Shard {
  std::shared_ptr<RecordSource> source;  // while pinned: the cache file, open
  Fd lock;                               // and its shared lock
  int pins = 0;                          // open() sources alive, and pin()s
  int64_t reads_left = 0;                // records the planned pass has yet to read
  int64_t rank = kNotPlanned;            // its place in the plan
  int64_t next_rank = kNotPlanned;       // its place among the next pass's first shards
  int64_t last_use = 0;
  bool present = false;                  // complete in the cache, as far as this stream knows
  bool demanded = false;                 // a reader waits for it
  bool seen = false;                     // opened or fetched in this pass (a cache hit counts once)
  bool solo = false;                     // fetched alone: its batch failed, so that a failure names it
  std::string failed;                    // why it could not be fetched
};

// An open shard as the reader sees it: reads go to the cache file; the shard stays until this is gone.
class ShardStream::Pinned final : public RecordSource {
 public:
  Pinned(ShardStream* stream, int32_t k, std::shared_ptr<RecordSource> file)
      : stream_(stream), k_(k), file_(std::move(file)) {}
  ~Pinned() override { stream_->release(k_); }
  const std::string& path() const override { return file_->path(); }
  IoMode mode() const override { return file_->mode(); }
  const std::string& fallback_reason() const override { return file_->fallback_reason(); }
  int64_t size_at_open() const override { return file_->size_at_open(); }
  int64_t mtime_ns_at_open() const override { return file_->mtime_ns_at_open(); }
  int64_t current_size() const override { return file_->current_size(); }
  int64_t read_at_most(void* dst, int64_t len, int64_t offset) const override {
    return file_->read_at_most(dst, len, offset);
  }
  bool visit_mapped(const int64_t* offsets, int64_t count, int64_t len, MappedVisitor fn, void* ctx,
                    int64_t* done) const override {
    return file_->visit_mapped(offsets, count, len, fn, ctx, done);
  }
  void will_need(int64_t offset, int64_t len) const override { file_->will_need(offset, len); }
  void populate(int64_t offset, int64_t len) const override { file_->populate(offset, len); }

 private:
  ShardStream* stream_;
  int32_t k_;
  std::shared_ptr<RecordSource> file_;
};

ShardStream::ShardStream(std::vector<RemoteObject> objects, RemoteAuth auth, TransferOptions options,
                         std::string dir, int64_t limit, FunctionRef<void()> check)
    : objects_(std::move(objects)), auth_(auth), options_(options), dir_(std::move(dir)), limit_(limit),
      owner_pid_(::getpid()), http_(std::make_unique<HttpTransfers>(std::move(auth), options)),
      batch_bytes_(std::max<int64_t>(1, int64_t(options.max_in_flight) * options.part_bytes)) {
  make_cache_dir(dir_);
  infos_ = http_->head(objects_, check);
  start();
}

ShardStream::ShardStream(std::vector<RemoteObject> objects, std::vector<ObjectInfo> infos, RemoteAuth auth,
                         TransferOptions options, std::string dir, int64_t limit)
    : objects_(std::move(objects)), infos_(std::move(infos)), auth_(auth), options_(options),
      dir_(std::move(dir)), limit_(limit), owner_pid_(::getpid()),
      http_(std::make_unique<HttpTransfers>(std::move(auth), options)),
      batch_bytes_(std::max<int64_t>(1, int64_t(options.max_in_flight) * options.part_bytes)) {
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
  if (::getpid() != owner_pid_) {
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
  if (::getpid() != owner_pid_)
    throw Error(ErrorKind::kState, "this remote WebDataset was made in another process (before a fork), whose "
                                   "fetch thread it cannot use here: make the WebDataset in this process");
}

std::vector<std::string> ShardStream::paths() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(dir_ + "/" + f);
  return out;
}

void ShardStream::plan(const std::vector<int32_t>& order, const std::vector<int64_t>& reads,
                       const std::vector<int32_t>& next) {
  check_process();
  FP_CHECK_VALUE(reads.size() == shards_.size(), "a stream's plan needs one read count per shard");
  for (const auto* list : {&order, &next})
    for (int32_t k : *list)
      FP_CHECK_VALUE(k >= 0 && size_t(k) < shards_.size(), "a stream's plan names shard " + std::to_string(k) +
                                                               " of " + std::to_string(shards_.size()));
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t k = 0; k < shards_.size(); ++k) {
    shards_[k].rank = shards_[k].next_rank = kNotPlanned;
    shards_[k].reads_left = std::max<int64_t>(0, reads[k]);
    shards_[k].seen = false;
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
  fetch_cv_.notify_one();
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
  fetch_cv_.notify_one();
}

std::unique_ptr<RecordSource> ShardStream::open(int32_t k) {
  check_process();
  FP_CHECK_VALUE(k >= 0 && size_t(k) < shards_.size(), "shard " + std::to_string(k) + " is out of range");
  std::unique_lock<std::mutex> lk(mu_);
  Shard& s = shards_[k];
  bool waited = false;
  struct Waiting {  // counted in blocked_seconds while it lasts, so that a stall shows as it happens
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
  } waiting{this};
  while (s.failed.empty() && !open_from_disk(k)) {
    waited = true;
    waiting.start();
    demand(k);
    ready_cv_.wait_for(lk, kPoll);
    if (stop_)
      throw Error(ErrorKind::kIO, "the dataset was closed while its shard '" + objects_[k].name + "' was fetched");
    if (s.failed.empty()) {
      lk.unlock();
      const bool cancelled = source_wait_cancelled();
      lk.lock();
      if (cancelled) throw Error(ErrorKind::kIO, "stopped while waiting for the shard '" + objects_[k].name + "'");
    }
  }
  if (!s.failed.empty()) throw Error(ErrorKind::kIO, s.failed);
  s.demanded = false;
  if (!s.seen && !waited) ++stats_.counts.hits;
  s.seen = true;
  ++s.pins;
  if (s.reads_left > 0) --s.reads_left;
  s.last_use = ++clock_;
  last_open_ = Clock::now();
  return std::make_unique<Pinned>(this, k, s.source);
}

void ShardStream::release(int32_t k) {
  std::lock_guard<std::mutex> lk(mu_);
  Shard& s = shards_[k];
  if (s.pins == 0 || --s.pins > 0) return;
  s.source.reset();
  s.lock.reset();
  fetch_cv_.notify_one();
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
  out.blocked_seconds += waiting_ * std::chrono::duration<double>(Clock::now() - waits_mark_).count();
  return out;
}

// Evicts (others' files first, least recently staged first; then this stream's shards that the plan reads
// no more, those the next pass does not begin with first, least recently used first, then the next pass's
// latest first; then those it reads after k, latest first; and for a shard a reader waits for while no
// reader has opened anything for 5 s, any not being read, latest first: a window larger than the cache,
// or reads the plan did not foresee, refetch but never stop) until k's `size` fits. Readers crossing from
// one window to the next wait for the new window's shards rather than evict the old window's last ones,
// which would be fetched again. A shard fetched for the next pass takes only room this pass no longer
// needs, and none from the next pass's earlier shards.
bool ShardStream::make_room_for(int32_t k, int64_t size, std::vector<CacheFile>& files, int64_t& used) {
  const auto& ours = shard_of_file_;
  const int64_t rank = shards_[k].rank;
  const bool for_next = shards_[k].reads_left == 0 && !shards_[k].demanded;
  const bool stuck = shards_[k].demanded && Clock::now() - last_open_ > kStuck;
  while (used + size > limit_) {
    size_t best = files.size();
    int tier_best = 5;
    int64_t key_best = 0;
    for (size_t f = 0; f < files.size(); ++f) {
      const auto it = ours.find(files[f].file);
      int tier;
      int64_t key;
      if (it == ours.end()) {
        tier = 0, key = files[f].mtime;
      } else {
        const Shard& s = shards_[it->second];
        if (it->second == k || s.pins > 0 || s.demanded) continue;
        if (s.reads_left == 0 && s.next_rank == kNotPlanned) tier = 1, key = s.last_use;
        else if (s.reads_left == 0) tier = 2, key = -s.next_rank;
        else if (s.rank > rank) tier = 3, key = -s.rank;
        else if (stuck) tier = 4, key = -s.rank;
        else continue;
        if (for_next && (tier > 2 || (tier == 2 && s.next_rank < shards_[k].next_rank))) continue;
      }
      if (tier < tier_best || (tier == tier_best && key < key_best)) best = f, tier_best = tier, key_best = key;
    }
    if (best == files.size()) return false;
    const auto it = ours.find(files[best].file);
    if (evict_cache_file(dir_, files[best].file)) {
      used -= files[best].size;
      if (it != ours.end()) shards_[it->second].present = false, ++stats_.evicted;
    }
    files.erase(files.begin() + static_cast<std::ptrdiff_t>(best));
  }
  return true;
}

// The next shards to fetch (with the lock held): those readers wait for, then the plan's, up to about a
// batch of transfers, each with room made for it under the limit.
std::vector<int32_t> ShardStream::choose_batch() {
  while (!demanded_.empty() && !shards_[demanded_.front()].demanded) demanded_.pop_front();
  std::vector<int32_t> wanted;
  std::vector<bool> taken(shards_.size(), false);
  auto want = [&](int32_t k) {
    const Shard& s = shards_[k];
    if (taken[k] || s.present || !s.failed.empty()) return;
    taken[k] = true;
    wanted.push_back(k);
  };
  for (int32_t k : demanded_) want(k);
  for (int32_t k : plan_)
    if (shards_[k].reads_left > 0) want(k);
  for (int32_t k : next_) want(k);  // after every shard of this pass: room this pass does not need
  std::vector<int32_t> batch;
  std::vector<CacheFile> files;
  int64_t used = 0, bytes = 0;
  if (limit_ >= 0 && !wanted.empty()) {
    files = list_cache(dir_);
    for (const auto& f : files) used += f.size;
  }
  for (int32_t k : wanted) {
    Shard& s = shards_[k];
    if (!batch.empty() && (bytes >= batch_bytes_ || s.solo)) break;
    if (limit_ >= 0) {
      if (!make_room_for(k, infos_[k].size, files, used)) break;
      used += infos_[k].size;
    }
    batch.push_back(k);
    bytes += infos_[k].size;
    if (s.solo) break;
  }
  return batch;
}

void ShardStream::run() {
  auto check = [this] {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) throw Error(ErrorKind::kIO, "the shard stream is closing");
  };
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    const std::vector<int32_t> batch = choose_batch();
    if (batch.empty()) {
      fetch_cv_.wait_for(lk, kPoll);
      continue;
    }
    lk.unlock();
    std::vector<RemoteObject> objs;
    std::vector<ObjectInfo> infos;
    std::vector<std::string> files;
    for (int32_t k : batch) {
      objs.push_back(objects_[k]);
      infos.push_back(infos_[k]);
      files.push_back(files_[k]);
    }
    StagedShards counts;
    std::string failure;
    try {
      // Readers may open a shard as soon as it has its name: the counters follow each arrival.
      fetch_into_cache(objs, infos, files, *http_, dir_, counts, check, [this] {
        std::lock_guard<std::mutex> guard(mu_);
        stats_.transfer = http_->stats();
      });
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lk.lock();
    if (stop_) break;
    stats_.counts.hits += counts.hits;
    stats_.counts.fetched += counts.fetched;
    stats_.counts.waited += counts.waited;
    stats_.transfer = http_->stats();
    for (int32_t k : batch) {
      Shard& s = shards_[k];
      if (failure.empty()) {
        s.present = true;
        s.seen = true;  // counted by the fetch (fetched, or found there): its first open is no cache hit
      } else if (batch.size() == 1) {
        s.failed = failure;
      } else {
        s.solo = true;  // fetched again alone, so that its error, if any, is its own
      }
    }
    ready_cv_.notify_all();
  }
}

}  // namespace fastpipe
