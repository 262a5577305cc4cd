// Entry points that add each part's Python bindings to fastpipe._C.
#pragma once

#include <torch/extension.h>

namespace fastpipe {
void bind_loader(pybind11::module& m);
void bind_loader_specs(pybind11::module& m);
void bind_loader_test_hooks(pybind11::module& m);
}  // namespace fastpipe
