// A local cache of remote shards (cache_dir): each object is fetched into a temporary file and renamed to
// its final name only when complete; the final name holds a hash of the URL and of the object's version
// (ETag and size), so a shard changed on the server is a new file, never the old bytes. One process per
// cache fetches a shard at a time (an exclusive lock on its lock file; other processes sharing the cache
// wait for it and then read it); a process reading a shard holds a shared lock on it, so that no other
// process evicts it meanwhile; a process killed mid-download leaves a temporary file that is never read
// and is removed by the next process that takes the lock. With a limit, other files of the cache are
// evicted, least recently staged first, to make room.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/function_ref.h"
#include "core/http_fetch.h"

namespace fastpipe {

// An owned file descriptor (-1: none).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset();

 private:
  int fd_ = -1;
};

struct StagedShards {
  std::vector<std::string> paths;  // each object's local file
  std::vector<ObjectInfo> infos;
  int64_t hits = 0;                // shards found in the cache
  int64_t fetched = 0;             // shards this call downloaded
  int64_t waited = 0;              // shards another process was downloading
  int64_t evicted_bytes = 0;
};

// Stages `objects` into `dir` (created when missing), all of them at once. limit < 0: no limit but the
// disk's free space.
StagedShards stage_shards(const std::vector<RemoteObject>& objects, HttpTransfers& http, const std::string& dir,
                          int64_t limit, FunctionRef<void()> check);

// The cache file name of an object (what stage_shards writes): its URL's and version's hashes, then its
// base name made safe.
std::string cache_file_name(const std::string& name, const ObjectInfo& info);

// Creates `dir` and its parents where missing.
void make_cache_dir(const std::string& dir);

// One object being fetched into the cache by this process, under its lock: a temporary file of its size
// (a process killed meanwhile leaves only that, never read and removed by the next one to take the lock),
// renamed to its final name by finish(); dropped unfinished, its temporary file is removed.
class CacheDownload {
 public:
  enum class Found { kStarted, kComplete, kElsewhere };
  // Starts fetching dir/file, of `size` bytes (`name`: what errors call it), into `out`, unless the cache
  // holds it complete (kComplete) or another process holds its lock (kElsewhere: fetching, evicting or
  // reading it): then `out` stays empty. A disk without room for it is an Error.
  static Found start(const std::string& dir, const std::string& file, const std::string& name, int64_t size,
                     std::unique_ptr<CacheDownload>& out);
  ~CacheDownload();
  CacheDownload(const CacheDownload&) = delete;
  CacheDownload& operator=(const CacheDownload&) = delete;

  int fd() const { return fd_.get(); }  // written at the object's offsets
  const std::string& temp() const { return temp_; }
  // Gives it its final name (complete from then on) and releases its lock, or keeps it shared and returns
  // it (`shared`: this process reads the file, so that no other process evicts it).
  Fd finish(bool shared = false);

 private:
  CacheDownload(std::string dir, std::string file, std::string temp, Fd lock, Fd fd);
  std::string dir_, file_, temp_;
  Fd lock_, fd_;
};

// Fetches the objects into dir/files[k] unless they are complete there (counted in `out`), each under its
// lock, all in flight together; waits for those another process is fetching. Returns when every one is
// complete; a failure names the object, and leaves no file of it that is later read. `arrived` runs as
// each fetched object takes its final name (readable from then on).
void fetch_into_cache(const std::vector<RemoteObject>& objects, const std::vector<ObjectInfo>& infos,
                      const std::vector<std::string>& files, HttpTransfers& http, const std::string& dir,
                      StagedShards& out, FunctionRef<void()> check, FunctionRef<void()> arrived);

// Whether `path` is a regular file of `size` bytes (a cache file is complete once it has its final name).
bool cache_file_complete(const std::string& path, int64_t size);

// The cache's data files and their sizes and modification times (ns).
struct CacheFile {
  std::string file;
  int64_t size;
  int64_t mtime;
};
std::vector<CacheFile> list_cache(const std::string& dir);

// Removes a data file of the cache unless another process holds its lock (reading or fetching it): true
// when removed.
bool evict_cache_file(const std::string& dir, const std::string& file);

// A shared lock on a cache file (waits while another process fetches or evicts it): held while the file
// is read, so that no process evicts it meanwhile.
Fd lock_shared(const std::string& dir, const std::string& file);

// "N bytes (x.y MiB)", for messages.
std::string bytes_text(int64_t n);

}  // namespace fastpipe
