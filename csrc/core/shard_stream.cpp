#include "core/shard_stream.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
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
  bool waited = false;                   // counted as fetched by another process
  std::unique_ptr<Download> download;    // being fetched by this process
  std::string failed;                    // why it could not be fetched
};

enum : uint8_t { kWanted, kAsked, kWritten };

// A shard this process fetches: its temporary file, written part by part and read as parts arrive.
struct ShardStream::Download {
  std::unique_ptr<CacheDownload> file;
  std::shared_ptr<RecordSource> reader;  // the temporary file (the cache file once renamed: the same inode)
  int64_t span = 1;                      // a part's bytes
  std::vector<uint8_t> parts;            // kWanted, kAsked, kWritten
  int64_t left = 0;                      // parts not written

  std::pair<int64_t, int64_t> parts_of(int64_t begin, int64_t end) const {  // [first, last)
    return {begin / span, std::min<int64_t>(int64_t(parts.size()), (end + span - 1) / span)};
  }
};

// The fetch thread's feed (core/http_fetch.h): the stream's side, under its lock.
class ShardStream::Feed final : public PartFeed {
 public:
  explicit Feed(ShardStream* stream) : stream_(stream) {}
  void more(size_t want, std::vector<Part>& out) override {
    std::lock_guard<std::mutex> lk(stream_->mu_);
    stream_->more(want, out);
  }
  // Only the fetch thread begins and ends downloads: it reads them without the lock.
  int fd(size_t k) const override { return stream_->shards_[k].download->file->fd(); }
  const std::string& file(size_t k) const override { return stream_->shards_[k].download->file->temp(); }
  void written(const Part& part) override {
    std::lock_guard<std::mutex> lk(stream_->mu_);
    stream_->written(part);
  }
  void failed(size_t k, const std::string& why) override {
    std::lock_guard<std::mutex> lk(stream_->mu_);
    stream_->fetch_failed(int32_t(k), why);
  }

 private:
  ShardStream* stream_;
};

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
      owner_pid_(::getpid()), http_(std::make_unique<HttpTransfers>(std::move(auth), options)) {
  make_cache_dir(dir_);
  infos_ = http_->head(objects_, check);
  start();
}

ShardStream::ShardStream(std::vector<RemoteObject> objects, std::vector<ObjectInfo> infos, RemoteAuth auth,
                         TransferOptions options, std::string dir, int64_t limit)
    : objects_(std::move(objects)), infos_(std::move(infos)), auth_(auth), options_(options),
      dir_(std::move(dir)), limit_(limit), owner_pid_(::getpid()),
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
    ready_cv_.wait_for(lk, kPoll);
    if (stop_)
      throw Error(ErrorKind::kIO, "the dataset was closed while its shard '" + objects_[k].name + "' was fetched");
    lk.unlock();
    const bool cancelled = source_wait_cancelled();
    lk.lock();
    if (cancelled) throw Error(ErrorKind::kIO, "stopped while waiting for the shard '" + objects_[k].name + "'");
  }
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

// The next parts to request (with the lock held): those readers wait for (the shards they wait to open
// begun first), then the plan's in the order it first needs them, then the rest of the shards begun (each
// finished once begun: its lock keeps other processes waiting), then the next pass's first shards; each
// shard's fetch begun with room made for it under the limit.
void ShardStream::more(size_t want, std::vector<Part>& out) {
  auto ask = [&](int32_t k, int64_t p) {
    Download& d = *shards_[k].download;
    if (d.parts[size_t(p)] != kWanted) return;
    d.parts[size_t(p)] = kAsked;
    out.push_back(Part{size_t(k), p * d.span, std::min(infos_[k].size, (p + 1) * d.span)});
  };
  auto ask_all = [&](int32_t k) {
    const Download& d = *shards_[k].download;
    for (int64_t p = 0; p < int64_t(d.parts.size()) && out.size() < want; ++p) ask(k, p);
  };
  while (out.size() < want && !urgent_.empty()) {
    const auto [k, p] = urgent_.front();
    urgent_.pop_front();
    if (shards_[k].download) ask(k, p);
  }
  while (!demanded_.empty() && !shards_[demanded_.front()].demanded) demanded_.pop_front();
  for (int32_t k : demanded_)  // begun, a reader opens it; its reads then ask for the parts they need
    if (shards_[k].demanded) begin_fetch(k);
  bool room = true;
  for (; cursor_ < queue_.size() && out.size() < want; ++cursor_) {
    const auto [k, p] = queue_[cursor_];
    const Shard& s = shards_[k];
    if (s.present || !s.failed.empty() || (s.reads_left == 0 && !s.download)) continue;
    const Begun begun = begin_fetch(k);
    if (begun == Begun::kNoRoom) {
      room = false;
      break;
    }
    if (begun == Begun::kYes) ask(k, p);
  }
  for (int32_t k : downloading_) {
    if (out.size() >= want) return;
    ask_all(k);
  }
  if (!room || cursor_ < queue_.size()) return;  // after every part of this pass: room it does not need
  for (int32_t k : next_) {
    if (out.size() >= want) return;
    const Begun begun = begin_fetch(k);
    if (begun == Begun::kNoRoom) return;
    if (begun == Begun::kYes) ask_all(k);
  }
}

// Shard k being fetched by this process from now on (kYes; so already), or not: it is complete, failed or
// fetched by another process (kNo), or the limit leaves no room for it yet (kNoRoom).
ShardStream::Begun ShardStream::begin_fetch(int32_t k) {
  Shard& s = shards_[k];
  if (s.download) return Begun::kYes;
  if (s.present || !s.failed.empty()) return Begun::kNo;
  const int64_t size = infos_[k].size;
  try {
    if (limit_ >= 0) {
      std::vector<CacheFile> files = list_cache(dir_);
      int64_t used = downloading_bytes_;
      for (const auto& f : files) used += f.size;
      if (!make_room_for(k, size, files, used)) return Begun::kNoRoom;
    }
    std::unique_ptr<CacheDownload> file;
    switch (CacheDownload::start(dir_, files_[k], objects_[k].name, size, file)) {
      case CacheDownload::Found::kComplete:
        if (!s.seen) ++stats_.counts.hits;
        s.present = s.seen = true;
        ready_cv_.notify_all();
        return Begun::kNo;
      case CacheDownload::Found::kElsewhere:
        if (!s.waited) ++stats_.counts.waited;
        s.waited = true;
        return Begun::kNo;
      case CacheDownload::Found::kStarted:
        break;
    }
    auto d = std::make_unique<Download>();
    d->span = part_span(infos_[k], options_.part_bytes);
    d->parts.assign(size_t((size + d->span - 1) / d->span), kWanted);
    d->left = int64_t(d->parts.size());
    d->reader = open_record_source(file->temp(), IoMode::kPread);
    d->file = std::move(file);
    s.download = std::move(d);
  } catch (const std::exception& e) {
    fetch_failed(k, e.what());
    return Begun::kNo;
  }
  s.seen = true;  // counted as fetched: its first open is no cache hit
  ready_cv_.notify_all();  // readers waiting to open it read what has arrived from now on
  downloading_.push_back(k);
  downloading_bytes_ += size;
  if (s.download->left > 0) return Begun::kYes;
  written(Part{size_t(k), 0, 0});  // an empty shard is complete at once
  return Begun::kNo;
}

void ShardStream::written(const Part& part) {
  const int32_t k = int32_t(part.object);
  Shard& s = shards_[k];
  stats_.transfer = http_->stats();
  if (!s.download) return;
  Download& d = *s.download;
  if (part.end > part.begin) {
    d.parts[size_t(part.begin / d.span)] = kWritten;
    --d.left;
  }
  if (d.left == 0) {
    try {
      Fd lock = d.file->finish(s.pins > 0);
      if (s.pins > 0) s.source = d.reader, s.lock = std::move(lock);  // the readers' pin holds it from now on
    } catch (const std::exception& e) {
      fetch_failed(k, e.what());
      return;
    }
    s.download.reset();
    downloading_.erase(std::find(downloading_.begin(), downloading_.end(), k));
    downloading_bytes_ -= infos_[k].size;
    s.present = true;
    ++stats_.counts.fetched;
  }
  ready_cv_.notify_all();
}

void ShardStream::fetch_failed(int32_t k, const std::string& why) {
  Shard& s = shards_[k];
  s.failed = why;
  if (s.download) {  // its temporary file removed (readers hold it open until they see the failure)
    s.download.reset();
    downloading_.erase(std::find(downloading_.begin(), downloading_.end(), k));
    downloading_bytes_ -= infos_[k].size;
  }
  ready_cv_.notify_all();
}

void ShardStream::run() {
  auto check = [this] {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) throw Error(ErrorKind::kIO, "the shard stream is closing");
  };
  Feed feed(this);
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    const int64_t pokes = pokes_;
    lk.unlock();
    std::string failure;
    try {
      http_->fetch(objects_, infos_, feed, check);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lk.lock();
    if (stop_) break;
    stats_.transfer = http_->stats();
    // Not one object's failure (those reach fetch_failed): every shard on its way fails with it.
    if (!failure.empty())
      for (const int32_t k : std::vector<int32_t>(downloading_))
        fetch_failed(k, "'" + objects_[k].name + "': " + failure);
    ready_cv_.notify_all();
    // Nothing to fetch: until a reader, a plan or a released shard changes that, or another process's
    // download may have ended.
    fetch_cv_.wait_for(lk, kPoll, [&] { return stop_ || pokes_ != pokes; });
  }
  for (const int32_t k : downloading_) shards_[k].download.reset();  // their temporary files removed
  downloading_.clear();
}

}  // namespace fastpipe
