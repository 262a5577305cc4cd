#include "core/shard_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <thread>
#include <unordered_set>
#include <utility>

#include "core/error.h"
#include "core/sha256.h"

namespace fastpipe {
namespace {

constexpr size_t kHashChars = 16, kVersionChars = 8;

// A data file of the cache: <16 hex>-<8 hex>-<name>.
bool is_cache_file(const std::string& f) {
  if (f.size() < kHashChars + kVersionChars + 3 || f[kHashChars] != '-' || f[kHashChars + 1 + kVersionChars] != '-')
    return false;
  for (size_t i = 0; i < kHashChars + 1 + kVersionChars; ++i)
    if (i != kHashChars && !std::isxdigit(static_cast<unsigned char>(f[i]))) return false;
  return true;
}

Fd open_lock_file(const std::string& dir, const std::string& file) {
  const std::string path = dir + "/." + file + ".lock";
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  FP_SYSCALL(fd.get(), "cache_dir: creating the lock file '" + path + "'");
  return fd;
}

// The lock file of a cache file, taken exclusively without waiting: an invalid Fd when another process
// holds it (fetching, evicting or reading the file).
Fd try_lock(const std::string& dir, const std::string& file) {
  Fd fd = open_lock_file(dir, file);
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return Fd();
    if (errno != EINTR) throw_syscall("cache_dir: locking '" + dir + "/." + file + ".lock'", errno, __FILE__, __LINE__);
  }
  return fd;
}

// Removes the temporary files a killed download of `file` left (the caller holds its lock).
void remove_partial(const std::string& dir, const std::string& file) {
  const std::string prefix = "." + file + ".part-";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d))
    if (std::string(e->d_name).rfind(prefix, 0) == 0) ::unlink((dir + "/" + e->d_name).c_str());
  ::closedir(d);
}

// Marks a cache file staged now, for eviction's order: its modification time, strictly later than every one
// this process set before. The kernel's own file times advance by its clock tick (milliseconds), so two
// stagings within a tick would tie and the more recent one could be evicted first.
void mark_staged(const std::string& path) {
  static std::atomic<int64_t> last{0};
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const int64_t t_now = int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
  int64_t prev = last.load(), t = 0;
  do {
    t = std::max(t_now, prev + 1);
  } while (!last.compare_exchange_weak(prev, t));
  const timespec times[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(t / 1000000000), static_cast<long>(t % 1000000000)}};
  ::utimensat(AT_FDCWD, path.c_str(), times, 0);  // best effort: a failure only blurs the order
}

// Evicts the cache's other files, least recently staged first, until `needed` more bytes fit in `limit`.
int64_t make_room(const std::string& dir, const std::unordered_set<std::string>& ours, int64_t needed,
                  int64_t limit) {
  std::vector<CacheFile> others;
  int64_t used = 0;
  for (CacheFile& f : list_cache(dir)) {
    if (ours.count(f.file)) continue;
    used += f.size;
    others.push_back(std::move(f));
  }
  std::sort(others.begin(), others.end(), [](const CacheFile& a, const CacheFile& b) { return a.mtime < b.mtime; });
  int64_t evicted = 0;
  for (const CacheFile& f : others) {
    if (used + needed <= limit) break;
    if (evict_cache_file(dir, f.file)) used -= f.size, evicted += f.size;
  }
  return evicted;
}

}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string bytes_text(int64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld bytes (%.1f MiB)", static_cast<long long>(n), double(n) / (1 << 20));
  return buf;
}

std::string cache_file_name(const std::string& name, const ObjectInfo& info) {
  std::string base = name.substr(name.find_last_of('/') + 1);
  for (char& c : base)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  if (base.size() > 80) base = base.substr(base.size() - 80);
  return to_hex(sha256(name)).substr(0, kHashChars) + "-" +
         to_hex(sha256(info.etag + "\n" + std::to_string(info.size))).substr(0, kVersionChars) + "-" + base;
}

bool cache_file_complete(const std::string& path, int64_t size) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == size;
}

void make_cache_dir(const std::string& dir) {
  // With its parents (mkdir -p): the default, ~/.cache/fastpipe/shards, has none on a fresh machine.
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string part = dir.substr(0, end);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      throw_syscall("cache_dir: creating '" + part + "'", errno, __FILE__, __LINE__);
    if (end == std::string::npos) return;
  }
}

std::vector<CacheFile> list_cache(const std::string& dir) {
  std::vector<CacheFile> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw_syscall("cache_dir: listing '" + dir + "'", errno, __FILE__, __LINE__);
  while (dirent* e = ::readdir(d)) {
    const std::string f = e->d_name;
    struct stat st;
    if (!is_cache_file(f) || ::stat((dir + "/" + f).c_str(), &st) != 0) continue;
    out.push_back({f, int64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  }
  ::closedir(d);
  return out;
}

bool evict_cache_file(const std::string& dir, const std::string& file) {
  Fd lock = try_lock(dir, file);
  return lock.get() >= 0 && ::unlink((dir + "/" + file).c_str()) == 0;
}

Fd lock_shared(const std::string& dir, const std::string& file) {
  Fd fd = open_lock_file(dir, file);
  while (::flock(fd.get(), LOCK_SH) != 0)
    if (errno != EINTR) throw_syscall("cache_dir: locking '" + dir + "/." + file + ".lock'", errno, __FILE__, __LINE__);
  return fd;
}

CacheDownload::CacheDownload(std::string dir, std::string file, std::string temp, Fd lock, Fd fd)
    : dir_(std::move(dir)), file_(std::move(file)), temp_(std::move(temp)), lock_(std::move(lock)), fd_(std::move(fd)) {}

CacheDownload::~CacheDownload() {
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

CacheDownload::Found CacheDownload::start(const std::string& dir, const std::string& file, const std::string& name,
                                          int64_t size, std::unique_ptr<CacheDownload>& out) {
  const std::string path = dir + "/" + file;
  if (cache_file_complete(path, size)) return Found::kComplete;
  Fd lock = try_lock(dir, file);
  if (lock.get() < 0) return Found::kElsewhere;
  if (cache_file_complete(path, size)) return Found::kComplete;  // another process finished it
  remove_partial(dir, file);
  const std::string temp = dir + "/." + file + ".part-" + std::to_string(::getpid());
  Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  FP_SYSCALL(fd.get(), "cache_dir: creating '" + temp + "'");
  std::unique_ptr<CacheDownload> d(new CacheDownload(dir, file, temp, std::move(lock), std::move(fd)));
  if (size > 0) {
    const int err = ::posix_fallocate(d->fd(), 0, size);
    if (err == ENOSPC)
      throw Error(ErrorKind::kIO, "cache_dir '" + dir + "': no room for '" + name + "' (" + bytes_text(size) +
                                      "): the disk is full", ENOSPC);
  }
  out = std::move(d);
  return Found::kStarted;
}

Fd CacheDownload::finish(bool shared) {
  const std::string path = dir_ + "/" + file_;
  if (::rename(temp_.c_str(), path.c_str()) != 0)
    throw_syscall("cache_dir: renaming '" + temp_ + "'", errno, __FILE__, __LINE__);
  mark_staged(path);
  temp_.clear();
  fd_.reset();
  Fd lock = std::move(lock_);
  if (!shared) return Fd();
  while (::flock(lock.get(), LOCK_SH) != 0)  // exclusive to shared on the same descriptor
    if (errno != EINTR) throw_syscall("cache_dir: locking '" + dir_ + "/." + file_ + ".lock'", errno, __FILE__, __LINE__);
  return lock;
}

void fetch_into_cache(const std::vector<RemoteObject>& objects, const std::vector<ObjectInfo>& infos,
                      const std::vector<std::string>& files, HttpTransfers& http, const std::string& dir,
                      StagedShards& out, FunctionRef<void()> check, FunctionRef<void()> arrived) {
  // Every part of every object at once, in order; each object renamed as its last part is written.
  struct Feed final : PartFeed {
    std::vector<std::unique_ptr<CacheDownload>> downloads;
    std::vector<int64_t> left;  // bytes not written yet
    std::vector<Part> parts;
    size_t next = 0;
    StagedShards* out;
    FunctionRef<void()>* arrived;

    void more(size_t want, std::vector<Part>& o) override {
      for (; want > 0 && next < parts.size(); --want) o.push_back(parts[next++]);
    }
    int fd(size_t k) const override { return downloads[k]->fd(); }
    const std::string& file(size_t k) const override { return downloads[k]->temp(); }
    void written(const Part& p) override {
      if ((left[p.object] -= p.end - p.begin) == 0) arrive(p.object);
    }
    void failed(size_t, const std::string& why) override { throw Error(ErrorKind::kIO, why); }
    void arrive(size_t k) {
      downloads[k]->finish();  // and its lock released
      downloads[k].reset();
      ++out->fetched;
      (*arrived)();
    }
  };
  const int64_t part_bytes = http.options().part_bytes;
  std::vector<size_t> todo;
  for (size_t k = 0; k < objects.size(); ++k) todo.push_back(k);
  std::vector<bool> waited(objects.size(), false);
  while (!todo.empty()) {
    Feed feed;
    feed.downloads.resize(objects.size());
    feed.left.assign(objects.size(), 0);
    feed.out = &out;
    feed.arrived = &arrived;
    std::vector<size_t> waiting, empty;
    for (size_t k : todo) {
      switch (CacheDownload::start(dir, files[k], objects[k].name, infos[k].size, feed.downloads[k])) {
        case CacheDownload::Found::kComplete:
          ++out.hits;
          break;
        case CacheDownload::Found::kElsewhere:
          waiting.push_back(k);
          out.waited += waited[k] ? 0 : 1;
          waited[k] = true;
          break;
        case CacheDownload::Found::kStarted: {
          const int64_t size = infos[k].size, span = part_span(infos[k], part_bytes);
          feed.left[k] = size;
          if (size == 0) empty.push_back(k);
          for (int64_t at = 0; at < size; at += span) feed.parts.push_back(Part{k, at, std::min(size, at + span)});
          break;
        }
      }
    }
    for (size_t k : empty) feed.arrive(k);
    if (!feed.parts.empty()) http.fetch(objects, infos, feed, check);
    todo = waiting;
    if (!todo.empty() && feed.parts.empty()) {  // only others' downloads left: wait for their locks
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      check();
    }
  }
}

StagedShards stage_shards(const std::vector<RemoteObject>& objects, HttpTransfers& http, const std::string& dir,
                          int64_t limit, FunctionRef<void()> check) {
  make_cache_dir(dir);
  StagedShards out;
  out.infos = http.head(objects, check);
  std::unordered_set<std::string> ours;
  std::vector<std::string> files(objects.size());
  int64_t total = 0, missing_bytes = 0;
  std::vector<RemoteObject> todo;
  std::vector<ObjectInfo> todo_infos;
  std::vector<std::string> todo_files;
  for (size_t k = 0; k < objects.size(); ++k) {
    files[k] = cache_file_name(objects[k].name, out.infos[k]);
    out.paths.push_back(dir + "/" + files[k]);
    if (!ours.insert(files[k]).second) continue;  // the same object twice
    total += out.infos[k].size;
    if (cache_file_complete(out.paths[k], out.infos[k].size)) {
      ++out.hits;
      mark_staged(out.paths[k]);  // recently staged: evicted last
    } else {
      todo.push_back(objects[k]);
      todo_infos.push_back(out.infos[k]);
      todo_files.push_back(files[k]);
      missing_bytes += out.infos[k].size;
    }
  }
  if (limit >= 0 && total > limit)
    throw Error(ErrorKind::kValue, "cache_limit is " + bytes_text(limit) + " but the " +
                                       std::to_string(ours.size()) + " files hold " + bytes_text(total) +
                                       ": a packed dataset is staged whole (raise cache_limit, or use a "
                                       "cache_dir with room; WebDataset shards stream through a smaller cache)");
  if (limit >= 0 && !todo.empty()) out.evicted_bytes = make_room(dir, ours, total, limit);
  struct statvfs fs;
  if (!todo.empty() && ::statvfs(dir.c_str(), &fs) == 0 && int64_t(fs.f_bavail) * int64_t(fs.f_frsize) < missing_bytes)
    throw Error(ErrorKind::kIO, "cache_dir '" + dir + "' has " + bytes_text(int64_t(fs.f_bavail) * int64_t(fs.f_frsize)) +
                                    " free but the shards to fetch need " + bytes_text(missing_bytes) +
                                    " (free space there, or set cache_dir elsewhere)", ENOSPC);
  fetch_into_cache(todo, todo_infos, todo_files, http, dir, out, check, [] {});
  return out;
}

}  // namespace fastpipe
