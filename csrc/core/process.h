// This process's id without a system call: objects that must not act in a forked child (threads that
// exist only in the parent, locks they may hold, device handles) compare it with the id they were made
// in, on paths taken for every batch, where getpid() costs a system call each time (two per batch).
#pragma once

#include <sys/types.h>

namespace fastpipe {

// getpid(), cached and refreshed in the child of every fork() (pthread_atfork).
pid_t current_pid();

}  // namespace fastpipe
