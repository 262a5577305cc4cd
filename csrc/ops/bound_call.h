// A builtin function of one float argument bound to a C++ object: Python calls it without pybind11's
// dispatcher, whose overload loop and argument casters cost ~0.8 us a call on cold caches (a training
// thread after a sleeping step: benchmarks/results/loader_next_vm_20261206.md). For calls made once per
// batch; everything else binds through pybind11 as usual.
#pragma once

#include <pybind11/pybind11.h>

namespace fastpipe {

using FloatCall = pybind11::object (*)(void* target, double arg);

// fn(arg) calls call(target, float(arg)); C++ exceptions become what pybind11 makes of them. The function
// holds `owner` (the Python object that owns target), so target outlives it.
pybind11::object bind_float_call(const pybind11::object& owner, void* target, FloatCall call, const char* name,
                                 const char* doc);

}  // namespace fastpipe
