// 1-D numpy arrays to and from std::vector, for the bindings that pass per-record tables.
#pragma once

#include <c10/util/Exception.h>
#include <pybind11/numpy.h>

#include <vector>

namespace fastpipe {

template <typename T>
pybind11::array_t<T> as_array(const std::vector<T>& v) {
  return pybind11::array_t<T>(v.size(), v.data());
}

template <typename T>
std::vector<T> to_vector(const pybind11::array_t<T, pybind11::array::c_style | pybind11::array::forcecast>& a,
                         const char* what) {
  TORCH_CHECK(a.ndim() == 1, what, " must be 1-D, got ", a.ndim(), "-D");
  return std::vector<T>(a.data(), a.data() + a.size());
}

}  // namespace fastpipe
