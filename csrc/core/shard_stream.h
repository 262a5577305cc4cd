// Remote shards read while they stream through a bounded local cache (a WebDataset larger than its
// cache_limit, or one whose reading should start before the last shard arrives). A fetch thread brings
// shards into the cache (core/shard_cache.h: temporary name, rename, locks shared with other processes)
// part by part, in the order the coming pass first reads their bytes, as far ahead as the limit allows,
// with requests in flight all the time, and evicts what that pass needs latest or no more (Belady's
// choice: the pass's order is known). Reader threads open a shard through open(): at once when it is
// in the cache or on its way (its reads then wait for the parts they need, which go first), else when
// its fetch starts; while a reader has a complete shard open it holds the shard's shared lock, so that
// no process evicts it (and only then: a pass that stops midway keeps nothing from other processes).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/function_ref.h"
#include "core/http_fetch.h"
#include "core/record_source.h"
#include "core/shard_cache.h"

namespace fastpipe {

struct StreamStats {
  StagedShards counts;          // hits, fetched, waited (paths and infos left empty)
  int64_t evicted = 0;          // shards of this stream evicted to make room
  int64_t fetching = 0;         // shards being fetched now (begun, not complete)
  double blocked_seconds = 0;   // reader threads' time waiting for a shard, summed over them (waits in
                                // progress included)
  TransferStats transfer;
};

class ShardStream final : public ShardOpener {
 public:
  // HEADs every object (check: as HttpTransfers::head's). limit < 0: no limit but the disk's free space.
  // Error(kValue) when a shard alone is larger than the limit.
  ShardStream(std::vector<RemoteObject> objects, RemoteAuth auth, TransferOptions options, std::string dir,
              int64_t limit, FunctionRef<void()> check);
  ~ShardStream();

  // A stream over blocks of these shards instead (block b: bytes [begin[b], end[b]) of shard shard[b]), in
  // the same cache, fetched by ranged GETs (a block's cache file is its own): data larger than its cache
  // then mixes blocks of many shards in a window of the same bytes. Error(kValue) for a range outside its
  // shard.
  std::shared_ptr<ShardStream> blocks(const std::vector<int32_t>& shard, const std::vector<int64_t>& begin,
                                      const std::vector<int64_t>& end) const;
  ShardStream(const ShardStream&) = delete;
  ShardStream& operator=(const ShardStream&) = delete;

  const std::vector<ObjectInfo>& infos() const { return infos_; }
  std::vector<std::string> paths() const;  // each shard's cache file (present or not)
  int64_t limit() const { return limit_; }

  // The coming pass reads shards in `order` (each once: the order of their first records) and reads[k]
  // records of shard k (order and reads index the objects); the pass after it begins with `next` (its
  // shards in the same sense), fetched while room is left that this pass's shards do not need, so that
  // the next pass does not start by waiting. Within them, bytes [need_begin[i], need_end[i]) of shard
  // need_shard[i] are read in the order of i (a shard's blocks: a window mixes blocks of many shards), so
  // their parts are fetched first, in that order; the rest of each shard follows. Replaces the previous
  // plan.
  void plan(const std::vector<int32_t>& order, const std::vector<int64_t>& reads,
            const std::vector<int32_t>& next = {}, const std::vector<int32_t>& need_shard = {},
            const std::vector<int64_t>& need_begin = {}, const std::vector<int64_t>& need_end = {});

  // Brings shards `ks` into the cache and keeps them there until unpin(ks) (the index reads them by path).
  void pin(const std::vector<int32_t>& ks, FunctionRef<void()> check);
  void unpin(const std::vector<int32_t>& ks);

  // Shard k, readable while the returned source lives: at once when it is in the cache, else once it has
  // arrived. A shard that could not be fetched is an Error naming its URL, every time it is opened.
  std::unique_ptr<RecordSource> open(int32_t k) override;
  size_t num_shards() const override { return objects_.size(); }

  StreamStats stats() const;

 private:
  struct Shard;
  struct Download;
  class Pinned;
  class Feed;
  struct Waiting;
  enum class Begun { kYes, kNo, kNoRoom };
  ShardStream(std::vector<RemoteObject> objects, std::vector<ObjectInfo> infos, RemoteAuth auth,
              TransferOptions options, std::string dir, int64_t limit);
  void start();  // infos_ known: the cache files, what the cache holds, the fetch thread
  void run();
  // The fetch thread's side (with the lock held): the next parts to request; a shard's fetch begun,
  // a part written, a shard failed.
  void more(size_t want, std::vector<Part>& out);
  Begun begin_fetch(int32_t k);
  void written(const Part& part);
  void fetch_failed(int32_t k, const std::string& why);
  void end_fetch(int32_t k);  // its Download dropped (complete, failed or stopped)
  bool make_room_for(int32_t k, int64_t size, std::vector<CacheFile>& files, int64_t& used);
  bool open_from_disk(int32_t k);
  // A reader of shard k while it arrives: returns once bytes [offset, offset + len) are written (true when
  // the whole shard is), throws when it cannot be fetched or the stream closes.
  bool await(int32_t k, int64_t offset, int64_t len);
  // A reader's wait for shard k, one poll long (with the lock held): an Error when the stream closes or
  // the reader is stopped meanwhile.
  void wait_for_shard(std::unique_lock<std::mutex>& lk, int32_t k);
  void demand(int32_t k);
  void poke();  // the fetch thread: something changed (with the lock held)
  void count_waits(int delta);
  void check_process() const;
  void release(int32_t k);

  std::vector<RemoteObject> objects_;
  std::vector<ObjectInfo> infos_;
  std::vector<std::string> files_;
  std::unordered_map<std::string, int32_t> shard_of_file_;  // files_[k] -> k
  const RemoteAuth auth_;
  const TransferOptions options_;
  const std::string dir_;
  const int64_t limit_;
  const int owner_pid_;  // a forked child inherits no fetch thread: every call there is refused
  std::unique_ptr<HttpTransfers> http_;

  mutable std::mutex mu_;
  std::condition_variable fetch_cv_;  // the fetch thread: demand, a plan, a shard unpinned, stop
  std::condition_variable ready_cv_;  // readers: a part or a shard arrived, or failed
  int64_t pokes_ = 0;                 // what fetch_cv_ waits on
  std::vector<Shard> shards_;
  std::deque<int32_t> demanded_;      // shards readers wait to open, first asked first
  std::deque<std::pair<int32_t, int64_t>> urgent_;  // (shard, part) a reader waits for
  std::vector<int32_t> downloading_;  // shards being fetched, in the order begun
  std::vector<int32_t> plan_;
  std::vector<std::pair<int32_t, int64_t>> queue_;  // (shard, part) in the order the plan first needs them
  size_t cursor_ = 0;                                // queue_'s first part not yet settled
  std::vector<int32_t> next_;  // the next pass's first shards
  int64_t clock_ = 0;
  std::chrono::steady_clock::time_point last_open_;  // a reader's latest open()
  int waiting_ = 0;                                   // readers waiting for a shard now
  std::chrono::steady_clock::time_point waits_mark_;  // since when waiting_ has held
  bool stop_ = false;
  StreamStats stats_;
  std::thread thread_;
};

}  // namespace fastpipe
