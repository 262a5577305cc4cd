// Python bindings used by the tests only: the CPU simulation of a device (core/sim_device.h), the
// fault injection in the file layer (core/fault.h), the device decode's colour model
// (kernels/jpeg_color.h) against libjpeg, and the JSON label field's parser (core/json_field.h).
#include <ATen/core/Tensor.h>
#include <pybind11/numpy.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "core/augment.h"
#include "core/fault.h"
#include "core/jpeg_decode.h"
#include "core/jpeg_header.h"
#include "core/json_field.h"
#include "core/png_decode.h"
#include "core/sim_device.h"
#include "ops/bindings.h"
#ifdef FASTPIPE_WITH_CUDA
#include "ops/cuda_host/nvjpeg_guard_check.h"
#endif

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
      .def(
          "set_jpeg_layout",
          [](SimDevice& d, const std::string& layout) {
            if (layout != "planar" && layout != "rgb")
              throw py::value_error("layout must be planar or rgb, got '" + layout + "'");
            d.set_jpeg_layout(layout == "planar" ? images::DecodedLayout::kYccPlanar
                                                 : images::DecodedLayout::kRgbInterleaved);
          },
          py::arg("layout"), "How decode_jpegs writes images: planar YCbCr (nvJPEG's YUV) or interleaved RGB.")
      .def("_fail", &SimDevice::fail, py::arg("what"), py::arg("count") = 1, py::arg("after") = 0)
      .def("_release_hangs", &SimDevice::release_hangs)
      .def("_hanging", &SimDevice::hanging)
      .def("_live_allocations", &SimDevice::live_allocations)
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
      "_json_integer_field",
      [](py::bytes data, const std::string& field) {
        const std::string d = data;
        int64_t value = 0;
        const std::string why = json_integer_field(d.data(), d.size(), field, &value);
        if (!why.empty()) throw py::value_error(why);
        return value;
      },
      py::arg("data"), py::arg("field"), "core/json_field.h's json_integer_field, for the tests (ValueError: why not).");
  m.def(
      "_fault_arm",
      [](const std::string& kind, const std::string& path, int64_t every, int64_t after, int64_t limit,
         uint64_t seed) {
        static const std::pair<const char*, fault::Kind> kKinds[] = {
            {"eintr", fault::Kind::kEintr}, {"eagain", fault::Kind::kEagain}, {"short", fault::Kind::kShort},
            {"eio", fault::Kind::kEio}, {"slow", fault::Kind::kSlow}};
        for (const auto& [name, k] : kKinds) {
          if (kind == name) {
            fault::arm(fault::Plan{k, path, every, after, limit, seed});
            return;
          }
        }
        throw py::value_error("fault kind must be eintr, eagain, short, eio or slow, got '" + kind + "'");
      },
      py::arg("kind"), py::arg("path") = "", py::arg("every") = 1, py::arg("after") = 0, py::arg("limit") = -1,
      py::arg("seed") = 0);
  m.def("_fault_disarm", &fault::disarm);
  m.def("_png_interlaced_budget", &set_interlaced_budget, py::arg("bytes"),
        "The bytes of samples an interlaced PNG may need (decoded whole); 0 restores kMaxInterlacedBytes.");
  m.def("_fault_count", &fault::injected);

  // One augmentation op (augment_ops.h's AugOp) at `magnitude` applied to an HWC uint8 image, as the
  // reader threads apply it (emulate_fma: without the CPU's FMA; by_factor: as ColorJitter plans it, the
  // magnitude being the factor; taps: a blur's kernel, the magnitude its sigma; bilinear (or bicubic), blend and
  // fill_value: the geometric ops' sampling, rounding: its fused multiply-adds, images::Sampling): the
  // per-op tests compare it with torchvision's functional op.
  m.def(
      "_augment_apply",
      [](const py::array_t<uint8_t, py::array::c_style | py::array::forcecast>& image, int op, float magnitude,
         const std::vector<int>& fill, bool emulate_fma, bool by_factor, std::pair<int, int> taps, bool bilinear,
         int blend, const std::vector<float>& fill_value, std::tuple<bool, bool, bool> rounding, bool bicubic) {
        if (image.ndim() != 3 || image.shape(2) != 3) throw py::value_error("image must be H x W x 3");
        if (op < 0 || op >= static_cast<int>(images::AugOp::kCount)) throw py::value_error("unknown op");
        if (fill.size() != 3 || fill_value.size() != 3) throw py::value_error("fill needs 3 values");
        if (blend < 0 || blend > 2) throw py::value_error("blend must be 0, 1 or 2");
        images::Sampling sampling;
        sampling.bilinear = bilinear;
        sampling.bicubic = bicubic;
        sampling.blend = blend;
        std::copy(fill_value.begin(), fill_value.end(), sampling.fill);
        std::tie(sampling.grid_fma, sampling.unnormalize_fma, sampling.interpolate_fma) = rounding;
        const int h = static_cast<int>(image.shape(0)), w = static_cast<int>(image.shape(1));
        images::SampleOps ops;
        ops.count = 1;
        ops.op[0] = by_factor ? images::plan_factor(static_cast<images::AugOp>(op), magnitude)
                              : images::plan_op(static_cast<images::AugOp>(op), magnitude, h, w, &sampling);
        if (op == static_cast<int>(images::AugOp::kBlur)) {
          for (const int t : {taps.first, taps.second})
            if (t < 1 || t > images::kMaxBlurTaps || t % 2 == 0) throw py::value_error("taps must be odd, 1 to 47");
          if (taps.first / 2 >= w || taps.second / 2 >= h) throw py::value_error("the kernel must fit the image");
          ops.op[0].taps[0] = taps.first;
          ops.op[0].taps[1] = taps.second;
          images::gaussian_weights(taps.first, magnitude, ops.blur);
          images::gaussian_weights(taps.second, magnitude, ops.blur + images::kMaxBlurTaps);
        }
        const uint8_t f[3] = {static_cast<uint8_t>(fill[0]), static_cast<uint8_t>(fill[1]), static_cast<uint8_t>(fill[2])};
        AugmentScratch s;
        const int64_t plane = static_cast<int64_t>(h) * w;
        s.image.resize(static_cast<size_t>(3 * plane));
        for (int64_t i = 0; i < plane; ++i)
          for (int c = 0; c < 3; ++c) s.image[c * plane + i] = image.data()[3 * i + c];
        augment_image(ops, f, h, w, s, emulate_fma);
        py::array_t<uint8_t> out({h, w, 3});
        for (int64_t i = 0; i < plane; ++i)
          for (int c = 0; c < 3; ++c) out.mutable_data()[3 * i + c] = s.image[c * plane + i];
        return out;
      },
      py::arg("image"), py::arg("op"), py::arg("magnitude"), py::arg("fill"), py::arg("emulate_fma") = false,
      py::arg("by_factor") = false, py::arg("taps") = std::pair<int, int>(1, 1), py::arg("bilinear") = false,
      py::arg("blend") = 0, py::arg("fill_value") = std::vector<float>{0.0f, 0.0f, 0.0f},
      py::arg("rounding") = std::make_tuple(true, true, true), py::arg("bicubic") = false);

  // The device decode's colour model over a whole JPEG: (its planes through images::ycc_pixel, libjpeg's
  // RGB decode), each height x width x 3 uint8, from the same libjpeg; the planes as decoded (Y, Cb, Cr).
  m.def(
      "_jpeg_ycc_model",
      [](const py::bytes& jpeg) {
        const std::string data = jpeg;
        const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
        JpegInfo info;
        std::string why;
        if (read_jpeg_info(bytes, data.size(), &info, &why) != JpegParse::kOk) throw py::value_error("not a JPEG: " + why);
        images::YccPlanes p;
        if (const char* why = device_jpeg_planes(info, &p))
          throw py::value_error(std::string("the model takes what a device decodes, not this JPEG: ") + why);
        std::vector<uint8_t> planes(static_cast<size_t>(images::ycc_planes_bytes(p)));
        py::array_t<uint8_t> model({info.height, info.width, 3}), reference({info.height, info.width, 3});
        JpegDecoder decoder;
        try {
          decoder.decode_planes(bytes, data.size(), p, planes.data());
          uint8_t* m_out = model.mutable_data();
          for (int y = 0; y < info.height; ++y)
            for (int x = 0; x < info.width; ++x)
              for (int c = 0; c < 3; ++c)
                *m_out++ = static_cast<uint8_t>(images::ycc_pixel(planes.data(), p, y, x, c));
          int64_t stride = 0;
          const uint8_t* px =
              decoder.decode(bytes, data.size(), info, 1, images::Region{0, info.height, 0, info.width}, &stride);
          for (int y = 0; y < info.height; ++y)
            std::memcpy(reference.mutable_data(y), px + y * stride, static_cast<size_t>(info.width) * 3);
        } catch (const std::runtime_error& e) {
          throw py::value_error(e.what());
        }
        return py::make_tuple(model, reference,
                              py::bytes(reinterpret_cast<const char*>(planes.data()), planes.size()));
      },
      py::arg("jpeg"));

  // nvJPEG's writes, on a GPU: (layout, each image's region's bytes, guard bytes each image changed).
  m.def(
      "_nvjpeg_guarded_decode",
      [](const std::vector<py::bytes>& jpegs, const std::string& library, int64_t guard) -> py::tuple {
#ifdef FASTPIPE_WITH_CUDA
        std::vector<std::string> data(jpegs.begin(), jpegs.end());
        cuda::GuardedDecode r;
        {
          py::gil_scoped_release nogil;
          r = cuda::guarded_decode(data, library, guard);
        }
        py::list outputs;
        for (const std::string& o : r.outputs) outputs.append(py::bytes(o));
        return py::make_tuple(r.layout == images::DecodedLayout::kYccPlanar ? "planar" : "interleaved", outputs,
                              r.overwritten);
#else
        (void)jpegs, (void)library, (void)guard;
        throw py::value_error("fastpipe was built without CUDA");
#endif
      },
      py::arg("jpegs"), py::arg("library"), py::arg("guard") = 4096);
}

}  // namespace fastpipe
