// The fuzz input as a real file: the engine opens files by path, so the harnesses write each input to
// one per-process temporary file, under $TMPDIR (run.sh points it at a tmpfs: writing a file per input
// on a disk is most of the time of an execution) or under the directory that `dir_env` names.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace fuzz {

class InputFile {
 public:
  explicit InputFile(const char* suffix, const char* dir_env = "TMPDIR") {
    const char* dir = std::getenv(dir_env);
    if (!dir || !*dir) dir = std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/fastpipe-fuzz-" + std::to_string(getpid()) + suffix;
  }
  ~InputFile() { ::unlink(path_.c_str()); }

  // Replaces the file's contents with data[0, size).
  const std::string& write(const uint8_t* data, size_t size) {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) std::abort();  // the scratch directory itself is broken: no input can be judged
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace fuzz
