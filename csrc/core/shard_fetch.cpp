// A ShardStream's fetch thread: the parts to ask for next, room made for them under the limit, and what
// becomes of them (core/shard_stream.h says what the stream does; shard_stream.cpp is the readers' side).
#include "core/shard_stream.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/error.h"
#include "core/shard_stream_state.h"

namespace fastpipe {
namespace {

// No shard opened this long while a reader waits: the readers wait on each other (an order the plan did
// not foresee). Not shorter: on a loaded machine one record can take a second, and evicting a shard the
// pass still reads costs a refetch.
constexpr auto kStuck = std::chrono::seconds(5);

}  // namespace

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
      int64_t used = 0;  // the cache's files, and the temporary files of the shards on their way
      for (const auto& f : files) used += f.size;
      for (const int32_t j : downloading_) used += infos_[j].size;
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
    end_fetch(k);
    s.present = true;
    ++stats_.counts.fetched;
  }
  ready_cv_.notify_all();
}

void ShardStream::fetch_failed(int32_t k, const std::string& why) {
  Shard& s = shards_[k];
  s.failed = why;
  if (s.download) end_fetch(k);  // its temporary file removed (readers hold it open until they see why)
  ready_cv_.notify_all();
}

void ShardStream::end_fetch(int32_t k) {
  shards_[k].download.reset();
  downloading_.erase(std::find(downloading_.begin(), downloading_.end(), k));
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
  while (!downloading_.empty()) end_fetch(downloading_.back());  // their temporary files removed
}

}  // namespace fastpipe
