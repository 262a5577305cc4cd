// Python bindings of the batch reader and the device pipeline (csrc/core): their errors become Python
// exceptions, batches become zero-copy tensors whose last reference returns the slot; and the shared
// errors, tables and settings are engine_tables.cpp's and reader_config.cpp's.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <c10/util/strides.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "core/batch_reader.h"
#include "core/device_pipeline.h"
#include "core/dtypes.h"
#include "core/error.h"
#include "core/image_column.h"
#include "core/pinned_arena.h"
#include "core/sim_device.h"
#include "ops/bindings.h"
#include "ops/bound_call.h"
#include "ops/interruptible.h"
#include "ops/reader_config.h"
#include "ops/traced_device.h"
#ifdef FASTPIPE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "ops/cuda_host/cuda_device.h"
#endif

namespace py = pybind11;

namespace fastpipe {
namespace {

c10::ScalarType scalar_type(DtypeId id) {
  switch (id) {  // every DtypeId: the compiler warns when core/dtypes.h gains one this misses
    case DtypeId::kBool: return c10::kBool;
    case DtypeId::kUInt8: return c10::kByte;
    case DtypeId::kInt8: return c10::kChar;
    case DtypeId::kInt16: return c10::kShort;
    case DtypeId::kUInt16: return c10::kUInt16;
    case DtypeId::kInt32: return c10::kInt;
    case DtypeId::kInt64: return c10::kLong;
    case DtypeId::kFloat16: return c10::kHalf;
    case DtypeId::kFloat32: return c10::kFloat;
    case DtypeId::kFloat64: return c10::kDouble;
  }
  throw Error(ErrorKind::kValue, "unhandled dtype id");
}

// An output's dtype: a file dtype (core/dtypes.h), or bfloat16, which only transforms produce.
c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "bfloat16") return c10::kBFloat16;
  const Dtype* d = find_dtype(name);
  if (!d) throw Error(ErrorKind::kValue, "unsupported dtype '" + name + "'");
  return scalar_type(d->id);
}

// A CPU batch's tensors hold its lease through their storage's context (record_stream finds it there).
struct LeaseRef {
  std::shared_ptr<Lease> lease;
  std::shared_ptr<PinnedArena> pinned;  // null without pin_memory
};

void delete_lease_ref(void* ctx) { delete static_cast<LeaseRef*>(ctx); }

// A device batch's tensors share one storage over its memory, whose context holds the batch: freeing
// the last tensor releases the batch (stream-ordered), and record_stream finds the batch from a tensor.
struct BatchRef {
  std::shared_ptr<DeviceBatch> batch;
};

void delete_batch_ref(void* ctx) { delete static_cast<BatchRef*>(ctx); }

DeviceBatch* batch_of(const at::Tensor& t) {
  const c10::DataPtr& p = t.storage().data_ptr();
  return p.get_deleter() == &delete_batch_ref ? static_cast<BatchRef*>(p.get_context())->batch.get() : nullptr;
}

// Where batches live: the CPU (BatchReader alone), a CUDA device, or the CPU simulation of one (tests).
struct DeviceChoice {
  std::shared_ptr<Device> device;       // null: CPU batches
  std::shared_ptr<SimDevice> sim;       // the simulation, when that is the device
  at::Device tensors{at::kCPU};         // the device of the batch tensors
};

DeviceChoice choose_device(const py::object& device, const std::string& nvjpeg = "") {
  DeviceChoice c;
  if (device.is_none()) return c;
  if (py::isinstance<SimDevice>(device)) {
    c.sim = device.cast<std::shared_ptr<SimDevice>>();
    c.device = c.sim;
    return c;
  }
  const int index = device.cast<int>();
#ifdef FASTPIPE_WITH_CUDA
  c.device = make_cuda_device(index, nvjpeg);
  c.tensors = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
  return c;
#else
  throw Error(ErrorKind::kState, "device='cuda:" + std::to_string(index) +
                                     "' needs fastpipe built with CUDA kernels (FASTPIPE_CUDA=0, a CPU-only torch or "
                                     "no CUDA toolkit at build time)");
#endif
}

// Overflow memory for a batch when every device slot is held (when_full="allocate"): torch's caching
// allocator on a GPU, allocated on the consumer's current stream and with the copy stream recorded, so
// that torch frees it stream-ordered for both. On the simulation, a pool that behaves the same way: a
// block is handed out again once the copy stream passes the point where its batch died, whatever the
// consumer's stream, which it was allocated on, still has queued (the pipeline orders its copy after
// that stream's work).
OverflowFn overflow_allocator(const DeviceChoice& c) {
  if (c.sim) {
    std::shared_ptr<SimDevice> sim = c.sim;
    return [sim](int64_t bytes, Stream* copy) {
      const size_t n = static_cast<size_t>(bytes);
      char* p = static_cast<char*>(sim->pool_alloc(n));
      std::shared_ptr<void> keep(p, [sim, copy, n](void* q) { sim->enqueue(copy, [sim, q, n] { sim->pool_free(q, n); }); });
      return OverflowBuffer{p, keep};
    };
  }
#ifdef FASTPIPE_WITH_CUDA
  const at::Device dev = c.tensors;
  return [dev](int64_t bytes, Stream* copy) {
    at::Tensor t = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(dev));
    c10::cuda::CUDACachingAllocator::recordStream(
        t.storage().data_ptr(), c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(copy), dev.index()));
    return OverflowBuffer{static_cast<char*>(t.data_ptr()), std::make_shared<c10::Storage>(t.storage())};
  };
#else
  return nullptr;
#endif
}

// What next() returns for a batch: its one tensor, the tuple of its tensors, or their list (which the
// dataset packs in Python).
enum class Pack { kTensor, kTuple, kList };

Pack parse_pack(const std::string& pack) {
  if (pack == "tensor") return Pack::kTensor;
  if (pack == "tuple") return Pack::kTuple;
  if (pack == "list") return Pack::kList;
  throw Error(ErrorKind::kValue, "pack must be 'tensor', 'tuple' or 'list', got '" + pack + "'");
}

// The reader (CPU batches) or the device pipeline (device batches), plus what turns their batches into
// tensors: per output, dtype and record shape.
class PyReader {
 public:
  PyReader(std::vector<ColumnSpec> columns, const std::vector<std::pair<std::string, std::vector<int64_t>>>& outputs,
           const ReaderConfig& config, const py::object& pin, const py::object& device, const std::string& nvjpeg,
           const std::string& pack)
      : choice_(choose_device(device, nvjpeg)), pack_(parse_pack(pack)) {
    TORCH_CHECK_VALUE(pack_ != Pack::kTensor || outputs.size() == 1, "pack='tensor' needs one output, got ",
                      outputs.size());
    ReaderOptions opt;
    static_cast<ReaderConfig&>(opt) = config;
    if (opt.gather != GatherIn::kThreads) {
      TORCH_CHECK_VALUE(!choice_.device, "num_threads=0 reads each batch in next() and makes CPU batches; a device "
                        "Loader reads ahead on its copy stream and needs reader threads (num_threads >= 1)");
      // The batch's chunks on torch's intra-op threads: the ones a CPU training step keeps busy.
      if (opt.gather == GatherIn::kNext) opt.num_threads = at::get_num_threads();
      opt.parallel_for = [](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& body) {
        at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { body(begin, end, at::get_thread_num()); });
      };
    }
    const bool allocate = opt.when_full == WhenFull::kAllocate;
    if (choice_.device) {
      OverflowFn overflow = allocate ? overflow_allocator(choice_) : nullptr;
      py::gil_scoped_release nogil;  // opening files and touching the arenas can take a while
      pipeline_ = std::make_unique<DevicePipeline>(std::make_shared<TracedDevice>(choice_.device), std::move(columns),
                                                   opt, std::move(overflow));
    } else {
      if (!pin.is_none()) {
        pinned_ = std::make_shared<PinnedArena>(choose_device(pin).device);
        pinned_->install(opt, pinned_);
      }
      if (allocate) {
        opt.overflow = [](int64_t bytes) {
          auto t = std::make_shared<at::Tensor>(at::empty({bytes}, at::kByte));
          return std::make_pair(static_cast<char*>(t->data_ptr()), std::shared_ptr<void>(t));
        };
      }
      py::gil_scoped_release nogil;
      reader_ = std::make_unique<BatchReader>(std::move(columns), opt);
    }
    const auto& layouts = pipeline_ ? pipeline_->outputs() : reader_->outputs();
    TORCH_CHECK(outputs.size() == layouts.size(), "expected ", layouts.size(), " output descriptions, got ",
                outputs.size());
    for (size_t k = 0; k < outputs.size(); ++k) {
      const auto dtype = parse_dtype(outputs[k].first);
      int64_t bytes = c10::elementSize(dtype);
      for (int64_t d : outputs[k].second) bytes *= d;
      TORCH_CHECK(bytes == layouts[k].record_bytes, "output ", k, ": dtype and shape give ", bytes,
                  " bytes per record, the column has ", layouts[k].record_bytes);
      OutputTensor& o = layouts_.emplace_back();
      o.sizes = {0};  // the batch's records
      o.sizes.insert(o.sizes.end(), outputs[k].second.begin(), outputs[k].second.end());
      const c10::DimVector strides = c10::contiguous_strides(o.sizes);
      o.strides.assign(strides.begin(), strides.end());
      o.item = static_cast<int64_t>(c10::elementSize(dtype));
      o.keys = c10::DispatchKeySet(c10::computeDispatchKey(dtype, at::kStrided, choice_.tensors));
      o.meta = caffe2::TypeMeta::fromScalarType(dtype);
    }
  }

  BatchReader& reader() const { return pipeline_ ? pipeline_->reader() : *reader_; }

  void start(py::array_t<int64_t, py::array::c_style | py::array::forcecast> indices, bool drop_last,
             uint64_t epoch, double timeout) {
    std::vector<int64_t> idx(indices.data(), indices.data() + indices.size());
    if (pipeline_) {
      interruptible([&](const std::function<void()>& poll) {
        pipeline_->start(std::move(idx), drop_last, epoch, timeout, poll);
        return true;
      });
    } else {
      py::gil_scoped_release nogil;
      reader_->start(std::move(idx), drop_last, epoch);
    }
  }

  py::object next(double timeout) {
    // The wait as a range of torch.profiler traces: a branch when no profiler records (a Python check of
    // that cost the training thread ~0.1 us a batch, the range itself ~15 us).
    RECORD_FUNCTION("fastpipe::loader.next", std::vector<c10::IValue>());
    return pipeline_ ? next_on_device(timeout) : next_on_host(timeout);
  }

  py::dict stats() const {
    if (!pipeline_) return stats_dict(reader().stats(), nullptr);
    const DeviceStats device = pipeline_->stats();
    return stats_dict(reader().stats(), &device);
  }

  // timeout <= 0: the device pipeline's submitter gets SerialWorker::kTeardownSeconds.
  void close(double timeout) {
    if (pipeline_) {
      interruptible([&](const std::function<void()>& poll) {
        pipeline_->close(timeout > 0 ? timeout : SerialWorker::kTeardownSeconds, poll);
        return true;
      });
    } else {
      py::gil_scoped_release nogil;
      reader_->close();
    }
  }
  std::vector<std::string> io_modes() const { return reader().io_modes(); }
  std::vector<std::string> warnings() const { return reader().warnings(); }
  void set_poison(bool on) { reader().set_poison(on); }
  void hold_reads(bool on) { reader().hold_reads(on); }
  void force_gather_in_next(int on) { reader().force_gather_in_next(on); }
  void force_spare_core(int on) { reader().force_spare_core(on); }
  int held_reads() const { return reader().held_reads(); }
  void set_skip_release_fence(bool on) {
    TORCH_CHECK(pipeline_, "only a device loader has release fences");
    pipeline_->set_skip_release_fence(on);
  }

 private:
  py::object next_on_host(double timeout) {
    // A ready batch is taken without releasing the GIL: the common case in a loop that keeps up.
    bool end = false;
    std::shared_ptr<Lease> lease = reader_->try_next(&end);
    if (!lease && !end)
      lease = interruptible([&](const std::function<void()>& poll) { return reader_->next(timeout, poll); });
    if (!lease) return py::none();
    if (lease->slot() < 0) warn_overflow();
    if (!warned_replaced_ && reader_->images_replaced() > 0) warn_replaced();
    // Every tensor of the batch holds the lease; the slot is freed when the last one dies.
    char* base = lease->data(0) - reader_->outputs()[0].offset;
    const int64_t bytes = reader_->outputs().back().offset +
                          reader_->outputs().back().record_bytes * lease->records();
    c10::DataPtr data(base, new LeaseRef{lease, pinned_}, &delete_lease_ref, at::kCPU);
    return tensors(c10::Storage(c10::Storage::use_byte_size_t(), bytes, std::move(data), nullptr, false), base,
                   lease->records(), [&](int k) { return lease->data(k); });
  }

  // The batch's tensors, output k at data(k) in `storage` (which starts at base), packed as pack_ says.
  // Made directly, as at::from_blob does (at::empty + set_ would go through the dispatcher twice), from
  // layouts computed once (no sizes or strides vectors per call).
  template <typename DataFn>
  py::object tensors(const c10::Storage& storage, const char* base, int64_t records, DataFn data) {
    const size_t n = layouts_.size();
    py::tuple out(pack_ == Pack::kTensor ? 0 : n);
    for (size_t k = 0; k < n; ++k) {
      const OutputTensor& o = layouts_[k];
      c10::SmallVector<int64_t, 6> sizes(o.sizes.begin(), o.sizes.end());
      sizes[0] = records;
      at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), o.keys, o.meta);
      t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, o.strides, (data(static_cast<int>(k)) - base) / o.item);
      if (pack_ == Pack::kTensor) return py::cast(std::move(t));
      out[k] = py::cast(std::move(t));
    }
    if (pack_ == Pack::kTuple) return std::move(out);
    return py::list(out);
  }

  py::object next_on_device(double timeout) {
    std::shared_ptr<DeviceBatch> batch =
        interruptible([&](const std::function<void()>& poll) { return pipeline_->next(timeout, poll); });
    if (!batch) return py::none();
    if (batch->overflow()) warn_overflow();
    if (!warned_replaced_ && reader().images_replaced() > 0) warn_replaced();
    char* base = batch->base();
    c10::DataPtr data(base, new BatchRef{batch}, &delete_batch_ref, choice_.tensors);
    return tensors(c10::Storage(c10::Storage::use_byte_size_t(), pipeline_->slot_bytes(), std::move(data), nullptr,
                                false),
                   base, batch->records(), [&](int k) { return batch->data(k); });
  }

  // Once per loader: the first bad image that on_error="replace" replaced.
  void warn_replaced() {
    warned_replaced_ = true;
    const ReaderStats s = reader().stats();
    const std::string msg = "fastpipe.Loader: " + (s.replaced.empty() ? std::string("an image could not be read") : s.replaced[0]) +
                            ". on_error='replace' substitutes bad images with other records; stats()['images_replaced'] "
                            "counts them and stats()['replaced'] lists the first.";
    if (PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) < 0) throw py::error_already_set();
  }

  // Once per loader: the program holds every slot, so batches now cost an allocation each.
  void warn_overflow() {
    if (warned_overflow_) return;
    warned_overflow_ = true;
    const int slots = reader().stats().num_slots;
    const std::string msg =
        "fastpipe.Loader: the program holds every one of the " + std::to_string(pipeline_ ? pipeline_->stats().device_slots : slots) +
        " arena slots (e.g. list(loader), or batches kept in a list), so this batch and the next ones while that "
        "lasts are read into freshly allocated memory (stats()['overflow_batches']). Drop or .clone() the batches "
        "you keep, or raise prefetch, to stay in the fixed arena; when_full='error' raises instead.";
    if (PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) < 0) throw py::error_already_set();
  }

  DeviceChoice choice_;
  std::shared_ptr<PinnedArena> pinned_;
  bool warned_overflow_ = false;
  bool warned_replaced_ = false;
  std::unique_ptr<BatchReader> reader_;
  std::unique_ptr<DevicePipeline> pipeline_;
  Pack pack_;
  struct OutputTensor {
    std::vector<int64_t> sizes, strides;  // sizes[0] is the batch's records
    int64_t item;
    c10::DispatchKeySet keys;
    caffe2::TypeMeta meta;
  };
  std::vector<OutputTensor> layouts_;
};

// fastpipe.record_stream: a batch's release also waits for the work queued on `stream` (a device
// batch's, or a pinned CPU batch's that a copy on that stream reads).
void record_stream(const at::Tensor& t, uintptr_t stream) {
  const c10::DataPtr& p = t.storage().data_ptr();
  if (p.get_deleter() == &delete_lease_ref) {
    const LeaseRef& ref = *static_cast<LeaseRef*>(p.get_context());
    TORCH_CHECK(ref.pinned, "record_stream: this batch's Loader does not pin its memory (pin_memory=False): no "
                            "asynchronous copy reads it, and nothing needs recording");
    if (ref.lease->slot() >= 0) ref.pinned->used_on(ref.lease->slot(), reinterpret_cast<Stream*>(stream));
    return;
  }
  DeviceBatch* b = batch_of(t);
  TORCH_CHECK(b, "record_stream: the tensor is not a batch of a fastpipe Loader (use torch's "
                 "Tensor.record_stream for memory torch allocated)");
  b->used_on(reinterpret_cast<Stream*>(stream));
#ifdef FASTPIPE_WITH_CUDA
  if (b->overflow() && t.is_cuda()) {  // an overflow batch lives in torch's caching allocator
    const auto& storage = *std::static_pointer_cast<c10::Storage>(b->overflow_buffer());
    c10::cuda::CUDACachingAllocator::recordStream(
        storage.data_ptr(), c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(stream), t.get_device()));
  }
#endif
}

}  // namespace

void bind_loader(py::module& m) {
  bind_engine_tables(m);
  bind_reader_config(m);

  m.def("record_stream", &record_stream, py::arg("tensor"), py::arg("stream"));

  m.def(
      "read_image_record",
      [](const ImageColumnSpec& spec, int64_t index, uint64_t epoch) {
        // One record through the whole image path, outside a Loader (ImageFolder.__getitem__, tests).
        TORCH_CHECK_INDEX(index >= 0 && index < spec.source->num_records(), "index ", index, " is out of range for ",
                          spec.source->num_records(), " records");
        std::unique_ptr<RecordSource> packed = open_image_column(spec);
        const images::ImageTransformParams& p = spec.transform;
        static const c10::ScalarType kType[] = {c10::kFloat, c10::kHalf, c10::kBFloat16, c10::kByte};
        const std::vector<int64_t> shape = p.out_nhwc ? std::vector<int64_t>{p.out_height, p.out_width, 3}
                                                      : std::vector<int64_t>{3, p.out_height, p.out_width};
        at::Tensor out = at::empty(shape, at::TensorOptions().dtype(kType[static_cast<int>(p.out_dtype)]));
        {
          py::gil_scoped_release nogil;
          ImageThreadState ts;
          read_image(spec, packed.get(), index, index, epoch, out.data_ptr(), ts);
        }
        return out;
      },
      py::arg("spec"), py::arg("index"), py::arg("epoch"));

  py::class_<PyReader>(m, "BatchReader")
      .def(py::init<std::vector<ColumnSpec>, const std::vector<std::pair<std::string, std::vector<int64_t>>>&,
                    const ReaderConfig&, const py::object&, const py::object&, const std::string&,
                    const std::string&>(),
           py::arg("columns"), py::arg("outputs"), py::arg("config"), py::arg("pin") = py::none(),
           py::arg("device") = py::none(), py::arg("nvjpeg") = "", py::arg("pack") = "list")
      .def("start", &PyReader::start, py::arg("indices"), py::arg("drop_last"), py::arg("epoch"),
           py::arg("timeout") = -1.0)
      .def("next", &PyReader::next, py::arg("timeout"))
      .def("next_function",
           [](const py::object& self) {
             return bind_float_call(
                 self, &self.cast<PyReader&>(),
                 [](void* reader, double timeout) { return static_cast<PyReader*>(reader)->next(timeout); }, "next",
                 "next(timeout): the reader's next batch, or None at the end of its pass");
           },
           "next() as a builtin bound to this reader: the same call without pybind11's dispatch (the loop's path)")
      .def("stats", &PyReader::stats)
      .def("close", &PyReader::close, py::arg("timeout") = -1.0)
      .def("io_modes", &PyReader::io_modes)
      .def("warnings", &PyReader::warnings)
      // Test hooks (core/batch_reader.h): tests/conftest.py reaches them through loader._reader.
      .def("_set_poison", &PyReader::set_poison, py::arg("on"))
      .def("_hold_reads", &PyReader::hold_reads, py::arg("on"))
      .def("_held_reads", &PyReader::held_reads)
      .def("_force_gather_in_next", &PyReader::force_gather_in_next, py::arg("on"))
      .def("_force_spare_core", &PyReader::force_spare_core, py::arg("on"))
      .def("_skip_release_fence", &PyReader::set_skip_release_fence, py::arg("on"));

}

}  // namespace fastpipe
