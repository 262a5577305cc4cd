#include "core/shard_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <thread>
#include <unordered_set>

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
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    throw_syscall("cache_dir: creating '" + dir + "'", errno, __FILE__, __LINE__);
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

void fetch_into_cache(const std::vector<RemoteObject>& objects, const std::vector<ObjectInfo>& infos,
                      const std::vector<std::string>& files, HttpTransfers& http, const std::string& dir,
                      StagedShards& out, FunctionRef<void()> check, FunctionRef<void()> arrived) {
  const std::string pid = std::to_string(::getpid());
  std::vector<size_t> todo;
  for (size_t k = 0; k < objects.size(); ++k) todo.push_back(k);
  std::vector<bool> waited(objects.size(), false);
  while (!todo.empty()) {
    std::vector<size_t> mine, waiting;
    std::vector<Fd> locks, fds;
    std::vector<std::string> temps;
    auto remove_temps = [&] {
      for (const auto& t : temps)
        if (!t.empty()) ::unlink(t.c_str());
    };
    for (size_t k : todo) {
      const std::string path = dir + "/" + files[k];
      if (cache_file_complete(path, infos[k].size)) {
        ++out.hits;
        continue;
      }
      Fd lock = try_lock(dir, files[k]);
      if (lock.get() < 0) {  // another process is fetching it (or evicting, or reading what it left)
        waiting.push_back(k);
        out.waited += waited[k] ? 0 : 1;
        waited[k] = true;
        continue;
      }
      if (cache_file_complete(path, infos[k].size)) {  // another process finished it
        ++out.hits;
        continue;
      }
      remove_partial(dir, files[k]);
      const std::string temp = dir + "/." + files[k] + ".part-" + pid;
      Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      FP_SYSCALL(fd.get(), "cache_dir: creating '" + temp + "'");
      temps.push_back(temp);  // before anything can throw: removed on failure
      if (infos[k].size > 0) {
        const int err = ::posix_fallocate(fd.get(), 0, infos[k].size);
        if (err == ENOSPC) {
          remove_temps();
          throw Error(ErrorKind::kIO, "cache_dir '" + dir + "': no room for '" + objects[k].name + "' (" +
                                          bytes_text(infos[k].size) + "): the disk is full", ENOSPC);
        }
      }
      mine.push_back(k);
      locks.push_back(std::move(lock));
      fds.push_back(std::move(fd));
    }
    if (!mine.empty()) {
      std::vector<RemoteObject> objs;
      std::vector<ObjectInfo> inf;
      std::vector<int> raw;
      for (size_t j = 0; j < mine.size(); ++j) {
        objs.push_back(objects[mine[j]]);
        inf.push_back(infos[mine[j]]);
        raw.push_back(fds[j].get());
      }
      try {
        http.get(objs, inf, raw, temps,
                 [&](size_t j) {
                   fds[j].reset();
                   const std::string path = dir + "/" + files[mine[j]];
                   if (::rename(temps[j].c_str(), path.c_str()) != 0)
                     throw_syscall("cache_dir: renaming '" + temps[j] + "'", errno, __FILE__, __LINE__);
                   temps[j].clear();
                   locks[j].reset();
                   ++out.fetched;
                   arrived();
                 },
                 check);
      } catch (...) {
        remove_temps();
        throw;
      }
    }
    todo = waiting;
    if (!todo.empty() && mine.empty()) {  // only others' downloads left: wait for their locks
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
      ::utimensat(AT_FDCWD, out.paths[k].c_str(), nullptr, 0);  // recently staged: evicted last
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
