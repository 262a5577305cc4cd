// A local cache of remote shards (cache_dir): each object is fetched into a temporary file and renamed to
// its final name only when complete; the final name holds a hash of the URL and of the object's version
// (ETag and size), so a shard changed on the server is a new file, never the old bytes. One process per
// cache fetches a shard at a time (a lock file each; other processes sharing the cache wait for it and
// then read it); a process killed mid-download leaves a temporary file that is never read and is removed
// by the next process that takes the lock. With a limit, other files of the cache are evicted, least
// recently staged first, to make room; shards that do not fit at all are an error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/function_ref.h"
#include "core/http_fetch.h"

namespace fastpipe {

struct StagedShards {
  std::vector<std::string> paths;  // each object's local file
  std::vector<ObjectInfo> infos;
  int64_t hits = 0;                // shards found in the cache
  int64_t fetched = 0;             // shards this call downloaded
  int64_t waited = 0;              // shards another process was downloading
  int64_t evicted_bytes = 0;
};

// Stages `objects` into `dir` (created when missing). limit < 0: no limit but the disk's free space.
StagedShards stage_shards(const std::vector<RemoteObject>& objects, HttpTransfers& http, const std::string& dir,
                          int64_t limit, FunctionRef<void()> check);

// The cache file name of an object (what stage_shards writes): its URL's and version's hashes, then its
// base name made safe.
std::string cache_file_name(const std::string& name, const ObjectInfo& info);

}  // namespace fastpipe
