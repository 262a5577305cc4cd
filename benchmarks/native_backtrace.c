// Preloaded (LD_PRELOAD) into the GPU check's test processes: on a fatal signal it appends the process's
// native stack to the file NATIVE_BACKTRACE_LOG names (else standard error). Python's faulthandler, on
// under pytest, prints only the Python frames and then hands the signal on to this handler; a file,
// because pytest captures each test's standard error and a crashed worker's capture is lost.
// benchmarks/device_check.sh builds it with gcc and resolves the frames in fastpipe's extension.
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int out_fd = 2;

static void on_fatal(int sig) {
  char head[96];
  const int len = snprintf(head, sizeof head, "--- native backtrace (pid %d, signal %d) ---\n", (int)getpid(), sig);
  void* frames[64];
  const int n = backtrace(frames, 64);
  (void)!write(out_fd, head, (size_t)len);
  backtrace_symbols_fd(frames, n, out_fd);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  const char* path = getenv("NATIVE_BACKTRACE_LOG");
  if (path && *path) {
    const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) out_fd = fd;
  }
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now rather than inside the handler
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal;
  const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; ++i) sigaction(fatal[i], &sa, NULL);
}
