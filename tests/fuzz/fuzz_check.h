// CHECK(cond): an invariant of the code under fuzzing; a broken one is a finding (libFuzzer reports the
// trap with its input), never an exception the harness might swallow.
#pragma once

#define CHECK(cond)                 \
  do {                              \
    if (!(cond)) __builtin_trap(); \
  } while (0)
