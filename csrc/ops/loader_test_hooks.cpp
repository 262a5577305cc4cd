// Python bindings used by the tests only: the CPU simulation of a device (core/sim_device.h) and the
// fault injection in the file layer (core/fault.h).
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "core/fault.h"
#include "core/sim_device.h"
#include "ops/bindings.h"

namespace py = pybind11;

namespace fastpipe {

void bind_loader_test_hooks(py::module& m) {
  // The CPU simulation of a device (core/sim_device.h), for tests: Loader(device="cuda") under
  // fastpipe.data._device.simulated(). Streams are handles (ints) as torch's cuda_stream values are.
  py::class_<SimDevice, std::shared_ptr<SimDevice>>(m, "SimDevice")
      .def(py::init([](int max_delay_us, uint64_t seed, int index) {
             return std::make_shared<SimDevice>(max_delay_us, seed, index);
           }),
           py::arg("max_delay_us") = 0, py::arg("seed") = 0, py::arg("index") = 1)
      .def_static("current_device", &SimDevice::current_device,
                  "The calling thread's current (simulated) device: 0 until something makes one current.")
      .def("consumer_stream", [](SimDevice& d) { return reinterpret_cast<uintptr_t>(d.consumer_stream()); })
      .def("new_stream", [](SimDevice& d) { return reinterpret_cast<uintptr_t>(d.new_stream()); })
      .def(
          "copy",
          [](SimDevice& d, uintptr_t stream, at::Tensor dst, const at::Tensor& src) {
            // Reads src's memory when the stream gets there, as a kernel would: src itself may be freed
            // by then (that is the point), dst is the test's and stays.
            TORCH_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.nbytes() == src.nbytes(),
                        "copy: contiguous tensors of equal size");
            const void* from = src.data_ptr();
            const size_t n = src.nbytes();
            d.enqueue(reinterpret_cast<Stream*>(stream), [dst, from, n] { std::memcpy(dst.data_ptr(), from, n); });
          },
          py::arg("stream"), py::arg("dst"), py::arg("src"))
      .def(
          "sleep",
          [](SimDevice& d, uintptr_t stream, int us) {
            d.enqueue(reinterpret_cast<Stream*>(stream), [us] { std::this_thread::sleep_for(std::chrono::microseconds(us)); });
          },
          py::arg("stream"), py::arg("us"))
      .def(
          "synchronize",
          [](SimDevice& d, uintptr_t stream) {
            // The host waits for the stream's work so far (torch.cuda.Stream.synchronize).
            Event* e = d.new_event();
            d.record(e, reinterpret_cast<Stream*>(stream));
            {
              py::gil_scoped_release nogil;
              d.synchronize(e);
            }
            d.delete_event(e);
          },
          py::arg("stream"))
      .def("drain", &SimDevice::drain, py::call_guard<py::gil_scoped_release>())
      .def("set_max_delay_us", &SimDevice::set_max_delay_us, py::arg("us"))
      .def("_fail", &SimDevice::fail, py::arg("what"), py::arg("count") = 1, py::arg("after") = 0)
      .def("misuses", &SimDevice::misuses)
      .def(
          "begin_capture",
          [](SimDevice& d, uintptr_t stream, const std::string& mode) {
            static const std::pair<const char*, int> kModes[] = {
                {"global", kCaptureGlobal}, {"thread_local", kCaptureThreadLocal}, {"relaxed", kCaptureRelaxed}};
            for (const auto& [name, m] : kModes)
              if (mode == name) return d.begin_capture(reinterpret_cast<Stream*>(stream), m);
            throw py::value_error("mode must be global, thread_local or relaxed (torch.cuda.graph's "
                                  "capture_error_mode), got '" + mode + "'");
          },
          py::arg("stream"), py::arg("mode") = "global",
          "A graph capture on the stream by the calling thread, as torch.cuda.graph begins one.")
      .def(
          "end_capture",
          [](SimDevice& d, uintptr_t stream) { return d.end_capture(reinterpret_cast<Stream*>(stream)); },
          py::arg("stream"), "Ends the stream's capture: why it was invalidated, '' when it is valid.");

  // Test hooks (core/fault.h): faults in the file layer's reads, for tests/data/test_loader_faults.py.
  m.def(
      "_fault_arm",
      [](const std::string& kind, const std::string& path, int64_t every, int64_t after, int64_t limit,
         uint64_t seed) {
        static const std::pair<const char*, fault::Kind> kKinds[] = {
            {"eintr", fault::Kind::kEintr}, {"eagain", fault::Kind::kEagain}, {"short", fault::Kind::kShort},
            {"eio", fault::Kind::kEio}};
        for (const auto& [name, k] : kKinds) {
          if (kind == name) {
            fault::arm(fault::Plan{k, path, every, after, limit, seed});
            return;
          }
        }
        throw py::value_error("fault kind must be eintr, eagain, short or eio, got '" + kind + "'");
      },
      py::arg("kind"), py::arg("path") = "", py::arg("every") = 1, py::arg("after") = 0, py::arg("limit") = -1,
      py::arg("seed") = 0);
  m.def("_fault_disarm", &fault::disarm);
  m.def("_fault_count", &fault::injected);
}

}  // namespace fastpipe
