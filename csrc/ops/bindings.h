// Entry points that add each part's Python bindings to fastpipe._C (pybind11 only: a file that binds no
// tensor compiles without torch/extension.h, the slowest header to parse).
#pragma once

#include <pybind11/pybind11.h>

namespace fastpipe {
void bind_loader(pybind11::module& m);
void bind_loader_specs(pybind11::module& m);
void bind_image_scans(pybind11::module& m);
void bind_loader_test_hooks(pybind11::module& m);
void bind_remote(pybind11::module& m);
void bind_pass_iterator(pybind11::module& m);
}  // namespace fastpipe
