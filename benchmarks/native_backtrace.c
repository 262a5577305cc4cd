// Preloaded (LD_PRELOAD) into the GPU check's test processes: on a fatal signal it prints the native
// stack, which Python's faulthandler (on under pytest) does not; faulthandler prints the Python frames
// first and then hands the signal on to this handler. benchmarks/device_check.sh builds it with gcc and
// resolves the frames in fastpipe's extension with addr2line.
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fatal(int sig) {
  static const char head[] = "\n--- native backtrace (benchmarks/native_backtrace.c) ---\n";
  void* frames[64];
  const int n = backtrace(frames, 64);
  (void)!write(2, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now rather than inside the handler
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal;
  const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; ++i) sigaction(fatal[i], &sa, NULL);
}
