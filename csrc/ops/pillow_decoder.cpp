#include "ops/pillow_decoder.h"

#include <pybind11/numpy.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

namespace py = pybind11;

namespace fastpipe {
namespace {

// A reader thread that waits for the GIL once the interpreter has begun to finalize never gets it (or is
// ended by Python while it holds the reader's locks). So the interpreter's exit is announced first, by
// an atexit callback (atexit runs before finalization begins): from then on no reader thread enters
// Python, and the callback waits (the GIL released) for those already inside.
std::atomic<bool> g_exiting{false};
std::atomic<int> g_inside{0};  // reader threads between their check of g_exiting and leaving Python

void on_interpreter_exit() {
  g_exiting = true;
  py::gil_scoped_release nogil;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (g_inside.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Whether a reader thread may enter Python now; while it holds an Entry, the interpreter's exit waits.
struct Entry {
  Entry() { ++g_inside; }
  ~Entry() { --g_inside; }
  bool allowed() const { return !g_exiting.load() && Py_IsInitialized(); }
};

class PythonDecoder final : public FallbackDecoder {
 public:
  explicit PythonDecoder(py::object fn) : fn_(new py::object(std::move(fn))) {}

  // The last reference may go in a reader thread, without the GIL; once the interpreter is exiting the
  // object is left as it is.
  ~PythonDecoder() override {
    Entry entry;
    if (!entry.allowed()) {
      fn_.release();  // NOLINT: deliberately leaked, nothing may free it any more
      return;
    }
    py::gil_scoped_acquire gil;
    fn_.reset();
  }

 protected:
  void decode_rgb(const uint8_t* data, size_t size, std::vector<uint8_t>* rgb, int* height, int* width) const override {
    Entry entry;
    if (!entry.allowed()) throw std::runtime_error("the Python interpreter is exiting");
    py::gil_scoped_acquire gil;
    try {
      // The encoded bytes as a bytes object, not a view of the reader's buffer (reused for the next record):
      // a decoder may keep what it is given (any view of a view would outlive a released memoryview). The
      // one copy replaces Pillow's: io.BytesIO shares a bytes object, where it copies a memoryview.
      py::object out = (*fn_)(py::bytes(reinterpret_cast<const char*>(data), size));
      auto a = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(out);
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
  static bool registered = false;  // with the GIL held
  if (!registered) {
    py::module_::import("atexit").attr("register")(py::cpp_function(&on_interpreter_exit));
    registered = true;
  }
  return std::make_shared<PythonDecoder>(std::move(decode));
}

}  // namespace fastpipe
