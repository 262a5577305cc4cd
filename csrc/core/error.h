// Error types of the engine. Each carries a complete, user-facing message (file, record, cause); the
// torch-facing layer maps the kind onto a Python exception type.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace fastpipe {

enum class ErrorKind {
  kValue,    // bad input: header defect, wrong argument  -> ValueError
  kIO,       // a system call failed, or a file changed under the reader -> OSError
  kTimeout,  // nothing arrived within the timeout -> TimeoutError
  kState,    // API misuse (closed loader, wrong process) -> RuntimeError
};

// Up to `max` bytes of data taken from a file, quotable in a message: printable ASCII as it is, every
// other byte as \xNN (messages become Python str, which must be valid UTF-8).
inline std::string quoted_bytes(const std::string& data, size_t max) {
  std::string out;
  for (size_t i = 0; i < data.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(data[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg, int err = 0)
      : std::runtime_error(msg), kind_(kind), errno_(err) {}
  ErrorKind kind() const { return kind_; }
  int error_number() const { return errno_; }

 private:
  ErrorKind kind_;
  int errno_;
};

// A failed system call: "<what>: <strerror> (errno N) [at file:line]".
[[noreturn]] inline void throw_syscall(const std::string& what, int err, const char* file, int line) {
  throw Error(ErrorKind::kIO,
              what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ") [" + file + ":" +
                  std::to_string(line) + "]",
              err);
}

// A failure in a destructor or another teardown path (a sticky device error after a device-side assert,
// interpreter shutdown): reported once on stderr and never thrown, which would end the process; what
// could not be released is left as it is (leaked).
inline void report_teardown_failure(const char* where, const char* what) noexcept {
  static std::atomic<bool> reported{false};
  if (!reported.exchange(true))
    std::fprintf(stderr,
                 "fastpipe: %s failed (%s); what it would have released is left as it is. Later teardown failures "
                 "are not reported.\n",
                 where, what);
}

}  // namespace fastpipe

// Checks a syscall that returns -1 and sets errno on failure; `what` is a std::string expression
// evaluated only on failure.
#define FP_SYSCALL(expr, what)                                        \
  do {                                                                \
    if ((expr) == -1) {                                               \
      int fp_err_ = errno;                                            \
      ::fastpipe::throw_syscall((what), fp_err_, __FILE__, __LINE__); \
    }                                                                 \
  } while (0)

#define FP_CHECK_VALUE(cond, msg)                                        \
  do {                                                                   \
    if (!(cond)) throw ::fastpipe::Error(::fastpipe::ErrorKind::kValue, (msg)); \
  } while (0)
