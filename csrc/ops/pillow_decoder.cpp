#include "ops/pillow_decoder.h"

#include <pybind11/numpy.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace fastpipe {
namespace {

class PythonDecoder final : public FallbackDecoder {
 public:
  explicit PythonDecoder(py::object fn) : fn_(new py::object(std::move(fn))) {}

  // The last reference may go in a reader thread, without the GIL; after the interpreter is gone the
  // object is left as it is.
  ~PythonDecoder() override {
    if (!Py_IsInitialized()) {
      fn_.release();  // NOLINT: deliberately leaked, nothing can free it any more
      return;
    }
    py::gil_scoped_acquire gil;
    fn_.reset();
  }

 protected:
  void decode_rgb(const uint8_t* data, size_t size, std::vector<uint8_t>* rgb, int* height, int* width) const override {
    if (!Py_IsInitialized()) throw std::runtime_error("the Python interpreter has shut down");
    py::gil_scoped_acquire gil;
    try {
      // The encoded bytes are lent for the call, not copied.
      py::memoryview view = py::memoryview::from_memory(data, static_cast<py::ssize_t>(size));
      auto a = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure((*fn_)(view));
      if (!a || a.ndim() != 3 || a.shape(2) != 3 || a.shape(0) < 1 || a.shape(1) < 1)
        throw std::runtime_error("the fallback decoder did not return an RGB image of shape (height, width, 3)");
      *height = static_cast<int>(a.shape(0));
      *width = static_cast<int>(a.shape(1));
      rgb->resize(static_cast<size_t>(a.size()));
      std::memcpy(rgb->data(), a.data(), rgb->size());
    } catch (py::error_already_set& e) {
      // "Type: message" (what() adds the traceback), read while the GIL is held, as the error is released.
      const std::string what =
          py::str(e.type().attr("__name__")).cast<std::string>() + ": " + py::str(e.value()).cast<std::string>();
      throw std::runtime_error(what);
    }
  }

 private:
  std::unique_ptr<py::object> fn_;
};

}  // namespace

std::shared_ptr<const FallbackDecoder> python_fallback_decoder(py::object decode) {
  return std::make_shared<PythonDecoder>(std::move(decode));
}

}  // namespace fastpipe
