#include "core/gather.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/batch_reader.h"
#include "core/error.h"

namespace fastpipe {
namespace {

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// Records smaller than this are read with no read-ahead (in random order it fetches other batches'
// pages); larger ones keep the kernel's read-ahead, which then runs within the record.
constexpr int64_t kSmallRecord = 64 << 10;
// A work item (chunk) of copied records carries no less than kMinChunkBytes (below it, handing work
// between threads costs more than it saves) and no more than about kChunkBytes: a longer one holds its
// reader longer than a step waits for its batch (ImageNet-like chunks of 3.3 MB on 2 cores: the loop
// waited on enough batches that the readers kept off its core for 37-57% of a sleeping step's batches,
// not 81-93%).
constexpr int64_t kChunkBytes = 1 << 20;
constexpr int64_t kMinChunkBytes = 256 << 10;
// Reader threads by default: the usable cores up to 8 for gathers (memory-bound copies), every core but
// the training loop's for records that decode (CPU-bound: an H200's 16 cores fed at most 8 readers and
// left the loop waiting 67% of a JPEG training step), or more for O_DIRECT, whose threads mostly wait on
// the device: random record reads reach a disk's sequential bandwidth only with a deep queue (measured:
// 16 reads in flight on a virtio disk).
constexpr int kMaxDefaultThreads = 8;
constexpr int kDirectDefaultThreads = 16;
// Images to decode: at most this many per work item (a decode takes about a millisecond; handing out
// work costs microseconds, and small items keep the threads evenly busy).
constexpr int64_t kImageChunk = 4;
// O_DIRECT reads go through a per-thread bounce buffer of at least this size.
constexpr int64_t kBounceBytes = 4 << 20;
// Default read-ahead: about this many bytes of batches, between kMinPrefetch and kMaxPrefetch batches.
// On 2 cores one reader shares its core with the training loop and falls behind the other, whose
// chunks then run ahead by the read-ahead's depth before it waits: 8 MiB rather than 4 kept both
// readers busy (+5-10% CIFAR-like records alone, +18% token windows; issue 41).
constexpr int64_t kPrefetchBytes = 8 << 20;
constexpr int64_t kMinPrefetch = 2;
constexpr int64_t kMaxPrefetch = 16;
// Page-cache warm-up step: about one read-ahead window per posix_fadvise call.
constexpr int64_t kWarmStep = 8 << 20;

template <typename T>
void widen_tokens(const char* __restrict__ src, int64_t block, int64_t* __restrict__ x, int64_t* __restrict__ y) {
  // A mapped record starts wherever the file puts it (a .npy header need not end on a multiple of the
  // token size): memcpy loads, which compile to plain unaligned loads, not a misaligned T*.
  auto token = [src](int64_t k) {
    T t;
    std::memcpy(&t, src + k * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return static_cast<int64_t>(t);
  };
  for (int64_t k = 0; k < block; ++k) x[k] = token(k);
  for (int64_t k = 0; k < block; ++k) y[k] = token(k + 1);
}

std::string record_context(const Column& c, int64_t record) {
  return "'" + c.spec.path + "': record " + std::to_string(record) + " (offset " +
         std::to_string(c.spec.data_offset + record * c.spec.record_stride) + ", " +
         std::to_string(c.spec.record_bytes) + " bytes)";
}

[[noreturn]] void throw_shrunk(const Column& c, int64_t record) {
  int64_t now = -1;
  try {
    now = c.source->current_size();
  } catch (const Error&) {
  }
  if (now == c.source->size_at_open()) {  // the size is intact: the mapped page itself could not be read
    throw Error(ErrorKind::kIO,
                "cannot read " + record_context(c, record) + ": reading its mapped page faulted (SIGBUS) although "
                    "the file still has its " + std::to_string(now) + " bytes: an I/O error on the device",
                EIO);
  }
  throw Error(ErrorKind::kIO, "cannot read " + record_context(c, record) + ": the file is now " +
                                  std::to_string(now) + " bytes, it was " + std::to_string(c.source->size_at_open()) +
                                  " when the loader opened it (it was truncated or replaced while being read)");
}

// File::read_at_most, with a failure naming the record it was reading (its message names the offset).
int64_t read_records(const Column& c, int64_t record, void* dst, int64_t len, int64_t offset) {
  try {
    return c.source->read_at_most(dst, len, offset);
  } catch (const Error& e) {
    throw Error(e.kind(), "cannot read " + record_context(c, record) + ": " + e.what(), e.error_number());
  }
}

}  // namespace

WidenFn widen_for(int bytes, bool is_signed) {
  switch (bytes) {
    case 1: return is_signed ? widen_tokens<int8_t> : widen_tokens<uint8_t>;
    case 2: return is_signed ? widen_tokens<int16_t> : widen_tokens<uint16_t>;
    case 4: return is_signed ? widen_tokens<int32_t> : widen_tokens<uint32_t>;
    case 8: return widen_tokens<int64_t>;
  }
  throw Error(ErrorKind::kValue, "token size must be 1, 2, 4 or 8 bytes, got " + std::to_string(bytes));
}

IoMode choose_mode(IoMode io, int64_t record_bytes, int64_t total_data_bytes, int64_t mem_available) {
  if (io != IoMode::kAuto) return io;
  // Large records of data that cannot stay in the page cache are read around it (buffered reads would
  // evict other pages and then miss anyway). Otherwise a mapping: a gather is one memcpy per record,
  // without a system call, and measured faster than pread for page-cached records of every size.
  if (record_bytes >= kSmallRecord && total_data_bytes > mem_available / 2) return IoMode::kDirect;
  return IoMode::kMmap;
}

int default_num_threads(long cores, bool any_direct, bool decodes) {
  // At least 2 either way: on 2 cores both read, kept off the loop's core while it computes (issue 21).
  const int threads = static_cast<int>(decodes ? std::clamp<long>(cores - 1, 2, kMaxReaderThreads)
                                               : std::clamp<long>(cores, 2, kMaxDefaultThreads));
  return any_direct ? std::max(threads, kDirectDefaultThreads) : threads;
}

int default_prefetch(int64_t batch_bytes) {
  const int64_t bytes = std::max<int64_t>(1, batch_bytes);
  return static_cast<int>(std::clamp<int64_t>((kPrefetchBytes + bytes - 1) / bytes, kMinPrefetch, kMaxPrefetch));
}

int64_t chunk_records(int64_t batch_size, int prefetch, int num_threads, int64_t record_bytes, bool decodes) {
  if (decodes) return std::clamp<int64_t>((batch_size + num_threads - 1) / num_threads, 1, kImageChunk);
  // Two chunks in the read-ahead window for each reader thread and for next(), which reads beside them.
  const int64_t per_batch = (2 * (static_cast<int64_t>(num_threads) + 1) + prefetch - 1) / std::max(prefetch, 1);
  const int64_t records = (batch_size + per_batch - 1) / per_batch;
  const int64_t at_most = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, record_bytes));
  return std::min({batch_size, at_most, std::max(share_records(record_bytes, false), records)});
}

int64_t share_records(int64_t record_bytes, bool decodes) {
  return decodes ? 1 : std::max<int64_t>(1, kMinChunkBytes / std::max<int64_t>(1, record_bytes));
}

int64_t mem_available_bytes() {
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  return pages > 0 ? static_cast<int64_t>(pages) * sysconf(_SC_PAGE_SIZE) : 0;
}

long usable_cores() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
}

Column open_column(ColumnSpec spec, IoMode mode, bool raw) {
  const ColumnSpec& s = spec;
  Column c;
  c.raw = raw;
  if (s.image) {
    FP_CHECK_VALUE(!s.token_bytes && !s.cmn, "'" + s.path + "': an image column takes no other conversion");
    c.source = open_image_column(*s.image);
    c.spec = std::move(spec);
    return c;
  }
  if (s.token_bytes) {
    c.widen = widen_for(s.token_bytes, s.token_signed);
    FP_CHECK_VALUE(s.record_bytes % s.token_bytes == 0 && s.record_bytes / s.token_bytes >= 2,
                   "'" + s.path + "': a token window needs at least 2 whole tokens");
  }
  if (s.cmn) {
    FP_CHECK_VALUE(!s.token_bytes && s.record_bytes == transforms::in_image_bytes(*s.cmn),
                   "'" + s.path + "': records of " + std::to_string(s.record_bytes) +
                       " bytes are not the transform's uint8 images of " +
                       std::to_string(transforms::in_image_bytes(*s.cmn)) + " bytes");
  }
  // A ColumnSpec takes any int64 from Python: a negative field would place records before the data (a
  // read before the mapping), and the end of the last record must be computed without overflow.
  FP_CHECK_VALUE(s.data_offset >= 0 && s.record_stride >= 0 && s.record_bytes >= 0 && s.num_records >= 0,
                 "'" + s.path + "': data_offset, record_stride, record_bytes and num_records must not be negative");
  int64_t need = s.data_offset;
  if (s.num_records > 0) {
    int64_t last = 0;
    FP_CHECK_VALUE(!__builtin_mul_overflow(s.num_records - 1, s.record_stride, &last) &&
                       !__builtin_add_overflow(need, last, &need) && !__builtin_add_overflow(need, s.record_bytes, &need),
                   "'" + s.path + "': its " + std::to_string(s.num_records) + " records of stride " +
                       std::to_string(s.record_stride) + " end past any possible file size");
  }
  c.source = open_record_source(s.path, mode, s.record_bytes < kSmallRecord);
  FP_CHECK_VALUE(c.source->size_at_open() >= need, "'" + s.path + "' is " + std::to_string(c.source->size_at_open()) +
                                                      " bytes but its " + std::to_string(s.num_records) +
                                                      " records need " + std::to_string(need));
  c.spec = std::move(spec);
  return c;
}

ThreadBuffers thread_buffers(const std::vector<Column>& columns, int64_t chunk) {
  ThreadBuffers tb;
  // The bounce buffer holds at least one whole aligned record of any O_DIRECT column; pread lands
  // records that are converted in the scratch buffer first.
  int64_t bounce = 0, scratch = 0;
  for (const Column& c : columns) {
    if (c.spec.image) {
      if (!tb.image) tb.image = std::make_unique<ImageThreadState>();
      continue;
    }
    if (c.source->mode() == IoMode::kDirect)
      bounce = std::max({bounce, kBounceBytes, align_up(c.spec.record_bytes, kDirectAlign) + 2 * kDirectAlign});
    if (c.converts() && c.source->mode() == IoMode::kPread) scratch = std::max(scratch, chunk * c.spec.record_bytes);
  }
  if (bounce) tb.bounce = std::make_unique<AlignedBuffer>(static_cast<size_t>(bounce));
  if (scratch) tb.scratch = std::make_unique<AlignedBuffer>(static_cast<size_t>(scratch));
  return tb;
}

std::string Column::io_name() const {
  if (spec.image && !source) return "files";
  return source ? choice_name(source->mode()) : "closed";
}

int64_t Column::output_record_bytes(int output) const {
  if (spec.image) {
    const ImageColumnSpec& im = *spec.image;
    if (im.device_decode && output == 0) return static_cast<int64_t>(sizeof(images::ImageDesc));
    if (im.device_decode && output == 1) return im.encoded_budget;
    return images::out_image_elements(im.transform) * transforms::out_dtype_bytes(im.transform.out_dtype);
  }
  if (!converts()) return spec.record_bytes;
  if (widen) return 8 * (spec.record_bytes / spec.token_bytes - 1);
  return transforms::out_image_elements(*spec.cmn) * transforms::out_dtype_bytes(spec.cmn->out_dtype);
}

void Sink::put(int64_t k, const char* src) const {
  char* out = dst + k * stride;
  if (!col->converts()) {
    std::memcpy(out, src, static_cast<size_t>(stride));
  } else if (col->widen) {
    col->widen(src, stride / 8, reinterpret_cast<int64_t*>(out), reinterpret_cast<int64_t*>(out + y_delta));
  } else {
    transforms::crop_mirror_normalize_host(*col->spec.cmn, reinterpret_cast<const uint8_t*>(src), out, 1, idx + k,
                                           epoch);
  }
}

void read_records(const Column& c, const int64_t* idx, int64_t count, const Sink& sink, ThreadBuffers& tb) {
  const ColumnSpec& s = c.spec;
  const int64_t len = s.record_bytes;
  tb.offsets.resize(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) tb.offsets[k] = s.data_offset + idx[k] * s.record_stride;
  const int64_t* off = tb.offsets.data();

  if (c.source->mode() == IoMode::kMmap) {
    int64_t done = 0;
    auto visit = [](void* ctx, int64_t k, const char* src) { static_cast<const Sink*>(ctx)->put(k, src); };
    if (!c.source->visit_mapped(off, count, len, visit, const_cast<Sink*>(&sink), &done)) throw_shrunk(c, idx[done]);
  } else {
    // Sorted by file offset: sequential runs become one request, and the disk sees ascending offsets.
    tb.order.resize(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) tb.order[k] = k;
    std::sort(tb.order.begin(), tb.order.end(), [&](int64_t a, int64_t b) { return off[a] < off[b]; });
    const int64_t* ord = tb.order.data();
    const bool direct = c.source->mode() == IoMode::kDirect;
    int64_t i = 0;
    while (i < count) {
      int64_t j = i + 1;
      if (direct) {
        // Records whose aligned extents touch share one aligned read through the bounce buffer.
        const int64_t start = off[ord[i]] / kDirectAlign * kDirectAlign;
        int64_t end = align_up(off[ord[i]] + len, kDirectAlign);
        while (j < count) {
          const int64_t e = align_up(off[ord[j]] + len, kDirectAlign);
          if (off[ord[j]] / kDirectAlign * kDirectAlign > end || e - start > static_cast<int64_t>(tb.bounce->size()))
            break;
          end = std::max(end, e);
          ++j;
        }
        const int64_t got = read_records(c, idx[ord[i]], tb.bounce->data(), end - start, start);
        for (int64_t k = i; k < j; ++k) {
          if (off[ord[k]] + len - start > got) throw_shrunk(c, idx[ord[k]]);
          sink.put(ord[k], tb.bounce->data() + (off[ord[k]] - start));
        }
      } else {
        // Adjacent in the file and in the batch (sequential order): one pread for the run, straight
        // into the slot for raw columns.
        while (j < count && off[ord[j]] == off[ord[i]] + (j - i) * len && ord[j] == ord[i] + (j - i)) ++j;
        const int64_t want = (j - i) * len;
        char* buf = c.converts() ? tb.scratch->data() : sink.dst + ord[i] * sink.stride;
        const int64_t got = read_records(c, idx[ord[i]], buf, want, off[ord[i]]);
        if (got < want) throw_shrunk(c, idx[ord[i + got / len]]);
        if (c.converts())
          for (int64_t k = i; k < j; ++k) sink.put(ord[k], buf + (k - i) * len);
      }
      i = j;
    }
  }
  // A mapping of a file that shrank reads zeros in the last page instead of faulting, and a pread
  // can race with truncation: confirm the file still covers every record read.
  int64_t max_k = 0;
  for (int64_t k = 1; k < count; ++k)
    if (off[k] > off[max_k]) max_k = k;
  if (count && c.source->current_size() < off[max_k] + len) throw_shrunk(c, idx[max_k]);
}

void warm_source(const RecordSource& f, const std::function<bool()>& stopped, bool populate) {
  for (int64_t off = 0; off < f.size_at_open(); off += kWarmStep) {
    if (stopped()) return;
    f.will_need(off, kWarmStep);
  }
  for (int64_t off = 0; populate && f.mode() == IoMode::kMmap && off < f.size_at_open(); off += kWarmStep) {
    if (stopped()) return;
    f.populate(off, kWarmStep);
  }
}

}  // namespace fastpipe
