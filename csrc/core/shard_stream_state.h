// A ShardStream's internals, shared by its readers' side (shard_stream.cpp: plan, open, the waits for
// parts) and its fetch thread (shard_fetch.cpp: which parts to ask for next, room, arrivals). Not part of
// the API.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/shard_stream.h"

namespace fastpipe {

using Clock = std::chrono::steady_clock;
inline constexpr auto kPoll = std::chrono::milliseconds(100);  // how often waits look again
inline constexpr int64_t kNotPlanned = std::numeric_limits<int64_t>::max();

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

enum : uint8_t { kWanted, kAsked, kWritten };  // a part of a Download

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

}  // namespace fastpipe
