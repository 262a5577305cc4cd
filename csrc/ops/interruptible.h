// Runs a blocking engine call without the GIL, giving it a poll that checks for Python signals: the call
// runs the poll while it waits (every ~100 ms), and Ctrl-C then ends it with KeyboardInterrupt.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <stdexcept>

namespace fastpipe {

template <typename Fn>
auto interruptible(Fn fn) {
  bool interrupted = false;
  decltype(fn(std::function<void()>())) result;
  {
    pybind11::gil_scoped_release nogil;
    try {
      result = fn([&] {
        pybind11::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {
          interrupted = true;
          throw std::runtime_error("interrupted");
        }
      });
    } catch (const std::runtime_error&) {
      if (!interrupted) throw;
    }
  }
  if (interrupted) throw pybind11::error_already_set();  // the KeyboardInterrupt set by PyErr_CheckSignals
  return result;
}

}  // namespace fastpipe
