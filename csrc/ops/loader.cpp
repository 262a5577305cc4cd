// Python bindings of the loader engine: engine errors become Python exceptions, leased slots become
// zero-copy tensors whose deleter returns the slot.
#ifdef FASTPIPE_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "core/engine.h"
#include "core/error.h"
#include "core/npy.h"
#include "ops/bindings.h"

namespace py = pybind11;

namespace fastpipe {
namespace {

void translate(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kValue:
      PyErr_SetString(PyExc_ValueError, e.what());
      return;
    case ErrorKind::kTimeout:
      PyErr_SetString(PyExc_TimeoutError, e.what());
      return;
    case ErrorKind::kState:
      PyErr_SetString(PyExc_RuntimeError, e.what());
      return;
    case ErrorKind::kIO: {
      // OSError(errno, message) picks the subclass (FileNotFoundError, PermissionError, ...).
      PyObject* args = e.error_number() ? Py_BuildValue("(is)", e.error_number(), e.what()) : Py_BuildValue("(s)", e.what());
      PyObject* exc = args ? PyObject_Call(PyExc_OSError, args, nullptr) : nullptr;
      Py_XDECREF(args);
      if (exc) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
        Py_DECREF(exc);
      }
      return;
    }
  }
}

py::dict header_dict(const NpyHeader& h) {
  py::dict d;
  d["version"] = py::make_tuple(h.major, h.minor);
  d["descr"] = h.descr;
  d["dtype"] = h.dtype;
  d["itemsize"] = h.itemsize;
  d["shape"] = py::tuple(py::cast(h.shape));
  d["data_offset"] = h.data_offset;
  d["data_bytes"] = h.data_bytes;
  d["file_size"] = h.file_size;
  return d;
}

c10::ScalarType parse_dtype(const std::string& name) {
  static const std::pair<const char*, c10::ScalarType> kTypes[] = {
      {"bool", c10::kBool},       {"uint8", c10::kByte},      {"int8", c10::kChar},     {"int16", c10::kShort},
      {"uint16", c10::kUInt16},   {"int32", c10::kInt},       {"int64", c10::kLong},    {"float16", c10::kHalf},
      {"float32", c10::kFloat},   {"float64", c10::kDouble},
  };
  for (const auto& t : kTypes)
    if (name == t.first) return t.second;
  throw Error(ErrorKind::kValue, "unsupported dtype '" + name + "'");
}

IoMode parse_io(const std::string& io) {
  if (io == "auto") return IoMode::kAuto;
  if (io == "mmap") return IoMode::kMmap;
  if (io == "pread") return IoMode::kPread;
  if (io == "direct") return IoMode::kDirect;
  throw Error(ErrorKind::kValue, "io must be 'auto', 'mmap', 'pread' or 'direct', got '" + io + "'");
}

#ifdef FASTPIPE_WITH_CUDA
void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(ErrorKind::kState, std::string("pin_memory: ") + what + ": " + cudaGetErrorString(err));
}

// Per-slot events: a pinned batch may still be the source of an asynchronous copy when the program drops
// it. torch's record_stream cannot track memory it did not allocate, so the release records an event
// on the current stream (after every copy queued from the batch) and the reader waits for it before
// writing into the slot again.
struct SlotFences {
  explicit SlotFences(int n) : events(static_cast<size_t>(n), nullptr), recorded(static_cast<size_t>(n)) {}
  ~SlotFences() {
    for (cudaEvent_t e : events)
      if (e) cudaEventDestroy(e);
  }
  std::vector<cudaEvent_t> events;
  std::vector<std::atomic<bool>> recorded;
};
#endif

// Page-locks the arena so that batch.to("cuda", non_blocking=True) is a true asynchronous copy.
void pin_arena(EngineOptions& opt) {
#ifdef FASTPIPE_WITH_CUDA
  opt.on_arena_alloc = [](void* p, size_t n) { cuda_check(cudaHostRegister(p, n, cudaHostRegisterDefault), "cudaHostRegister"); };
  opt.on_arena_free = [](void* p, size_t) { cudaHostUnregister(p); };
  auto fences = std::make_shared<SlotFences>(opt.num_slots);
  for (cudaEvent_t& e : fences->events) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  opt.on_slot_release = [fences](int slot) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    if (cudaEventRecord(fences->events[slot], stream) == cudaSuccess) fences->recorded[slot] = true;
  };
  opt.before_slot_fill = [fences](int slot) {
    if (fences->recorded[slot]) cuda_check(cudaEventSynchronize(fences->events[slot]), "cudaEventSynchronize");
  };
#else
  (void)opt;
  throw Error(ErrorKind::kState, "pin_memory=True needs fastpipe built with CUDA");
#endif
}

// The engine plus what turns its leases into tensors: per output, dtype and record shape.
class PyEngine {
 public:
  PyEngine(const std::vector<py::dict>& columns, const std::vector<std::pair<std::string, std::vector<int64_t>>>& outputs,
           int64_t batch_size, int num_threads, int prefetch, int num_slots, const std::string& io,
           bool pin_memory) {
    std::vector<ColumnSpec> specs;
    for (const py::dict& d : columns) {
      ColumnSpec s;
      s.path = d["path"].cast<std::string>();
      s.data_offset = d["data_offset"].cast<int64_t>();
      s.record_stride = d["record_stride"].cast<int64_t>();
      s.record_bytes = d["record_bytes"].cast<int64_t>();
      s.num_records = d["num_records"].cast<int64_t>();
      s.token_bytes = d.contains("token_bytes") ? d["token_bytes"].cast<int>() : 0;
      s.token_signed = d.contains("token_signed") ? d["token_signed"].cast<bool>() : false;
      specs.push_back(std::move(s));
    }
    EngineOptions opt;
    opt.batch_size = batch_size;
    opt.num_threads = num_threads;
    opt.prefetch = prefetch;
    opt.num_slots = num_slots;
    opt.io = parse_io(io);
    if (pin_memory) pin_arena(opt);
    {
      py::gil_scoped_release nogil;  // opening files and touching the arena can take a while
      engine_ = std::make_unique<Engine>(std::move(specs), opt);
    }
    const auto& layouts = engine_->outputs();
    TORCH_CHECK(outputs.size() == layouts.size(), "expected ", layouts.size(), " output descriptions, got ",
                outputs.size());
    for (size_t k = 0; k < outputs.size(); ++k) {
      const auto dtype = parse_dtype(outputs[k].first);
      int64_t bytes = c10::elementSize(dtype);
      for (int64_t d : outputs[k].second) bytes *= d;
      TORCH_CHECK(bytes == layouts[k].record_bytes, "output ", k, ": dtype and shape give ", bytes,
                  " bytes per record, the column has ", layouts[k].record_bytes);
      dtypes_.push_back(dtype);
      shapes_.push_back(outputs[k].second);
    }
  }

  void start(py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices, bool drop_last) {
    std::vector<int64_t> idx(indices.data(), indices.data() + indices.size());
    py::gil_scoped_release nogil;
    engine_->start(std::move(idx), drop_last);
  }

  py::object next(double timeout) {
    // A ready batch is taken without releasing the GIL: the common case in a loop that keeps up.
    bool end = false;
    std::shared_ptr<Lease> lease = engine_->try_next(&end);
    bool interrupted = false;
    if (!lease && !end) {
      py::gil_scoped_release nogil;
      try {
        lease = engine_->next(timeout, [&] {
          py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) {
            interrupted = true;
            throw std::runtime_error("interrupted");
          }
        });
      } catch (const std::runtime_error&) {
        if (!interrupted) throw;
      }
    }
    if (interrupted) throw py::error_already_set();  // the KeyboardInterrupt set by PyErr_CheckSignals
    if (!lease) return py::none();
    py::list out;
    for (size_t k = 0; k < dtypes_.size(); ++k) {
      std::vector<int64_t> sizes{lease->records()};
      sizes.insert(sizes.end(), shapes_[k].begin(), shapes_[k].end());
      // Every tensor of the batch holds the lease; the slot is freed when the last one dies.
      auto t = torch::from_blob(
          lease->data(static_cast<int>(k)), sizes, [lease](void*) {}, torch::TensorOptions().dtype(dtypes_[k]));
      out.append(py::cast(t));
    }
    return std::move(out);
  }

  py::dict stats() const {
    const EngineStats s = engine_->stats();
    py::dict d;
    d["batches"] = s.batches;
    d["bytes_read"] = s.bytes_read;
    d["read_seconds"] = s.read_seconds;
    d["wait_seconds"] = s.wait_seconds;
    d["wall_seconds"] = s.wall_seconds;
    d["arena_bytes"] = s.arena_bytes;
    d["num_slots"] = s.num_slots;
    d["slots_leased"] = s.slots_leased;
    d["num_threads"] = s.num_threads;
    d["waits"] = s.waits;
    return d;
  }

  void close() {
    py::gil_scoped_release nogil;
    engine_->close();
  }
  std::vector<std::string> io_modes() const { return engine_->io_modes(); }
  std::vector<std::string> warnings() const { return engine_->warnings(); }
  int64_t num_batches() const { return engine_->num_batches(); }
  void set_poison(bool on) { engine_->set_poison(on); }
  void hold_reads(bool on) { engine_->hold_reads(on); }
  int held_reads() const { return engine_->held_reads(); }

 private:
  std::unique_ptr<Engine> engine_;
  std::vector<c10::ScalarType> dtypes_;
  std::vector<std::vector<int64_t>> shapes_;
};

}  // namespace

void bind_loader(py::module& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      translate(e);
    }
  });

  m.def(
      "read_npy_header", [](const std::string& path) { return header_dict(read_npy_header(path)); }, py::arg("path"),
      "Reads and validates a .npy header; ValueError names the file and the defect.");
  m.def(
      "parse_npy_header",
      [](py::bytes buf, int64_t file_size, const std::string& path) {
        std::string s = buf;
        return header_dict(parse_npy_header(s.data(), s.size(), file_size, path));
      },
      py::arg("buf"), py::arg("file_size"), py::arg("path") = "<bytes>",
      "Validates a .npy header held in memory (the first bytes of a file of file_size bytes).");

  m.def(
      "_io_policy",
      [](const std::string& io, int64_t record_bytes, int64_t total_bytes, int64_t mem_available) {
        return std::string(mode_name(choose_mode(parse_io(io), record_bytes, total_bytes, mem_available)));
      },
      py::arg("io"), py::arg("record_bytes"), py::arg("total_bytes"), py::arg("mem_available"),
      "The read mode the engine picks for a column (tests check the policy on any figures).");
  m.def("_default_num_threads", &default_num_threads, py::arg("cores"), py::arg("any_direct"),
        "The reader threads the engine starts when none are asked for.");

  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const std::vector<py::dict>&, const std::vector<std::pair<std::string, std::vector<int64_t>>>&,
                    int64_t, int, int, int, const std::string&, bool>(),
           py::arg("columns"), py::arg("outputs"), py::arg("batch_size"), py::arg("num_threads"), py::arg("prefetch"),
           py::arg("num_slots"), py::arg("io"), py::arg("pin_memory") = false)
      .def("start", &PyEngine::start, py::arg("indices"), py::arg("drop_last"))
      .def("next", &PyEngine::next, py::arg("timeout"))
      .def("stats", &PyEngine::stats)
      .def("close", &PyEngine::close)
      .def("io_modes", &PyEngine::io_modes)
      .def("warnings", &PyEngine::warnings)
      // Test hooks (core/engine.h): tests/data/conftest.py reaches them through loader._engine.
      .def("_set_poison", &PyEngine::set_poison, py::arg("on"))
      .def("_hold_reads", &PyEngine::hold_reads, py::arg("on"))
      .def("_held_reads", &PyEngine::held_reads)
      .def_property_readonly("num_batches", &PyEngine::num_batches);
}

}  // namespace fastpipe
