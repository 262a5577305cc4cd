// libFuzzer harness of opening a token file, as TokenDataset (fastpipe/data/tokens.py) and the loader do.
//
// Which code: the checks of the user's arguments (block_size >= 1, a known dtype, a raw file holding whole
// tokens, a 1-D integer .npy, at least block_size + 1 tokens) live in Python; the C++ that a loader runs
// on the file is read_npy_header (for .npy token files) and then, in BatchReader's constructor,
// open_column (csrc/core/gather.cpp), which validates the ColumnSpec against the file, followed by
// read_records, which widens the token windows. BatchReader itself adds only thread and arena set-up,
// so the harness calls open_column and read_records directly (with BatchReader's two checks before it),
// over the input written to a real file.
//
// Input: kControl bytes, then (in spec mode) kSpecFields little-endian int64s, then the file.
//   byte 0  bit 0: the file is a .npy (else a raw .bin); bits 1-2: io mode (mmap, pread, direct, mmap);
//           bit 3: spec mode, bit 4: token_signed (spec mode)
//   byte 1  raw .bin: index of the token dtype; spec mode: token_bytes as is
//   byte 2-3  block_size (little-endian)
// Without spec mode the ColumnSpec is built exactly as TokenDataset._columns builds it, and open_column
// must accept it (the Python checks promise the file covers every window). Spec mode takes data_offset,
// record_stride, record_bytes and num_records from the input: _C.ColumnSpec takes any values from
// Python, so the engine's own checks are all that stand between them and the reads.
// Whenever open_column accepts, every record must lie inside the file, and reading the first, last and
// a few middle records must return exactly the file's tokens (or bytes, for token_bytes 0).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/gather.h"
#include "core/npy.h"
#include "fuzz_file.h"
#include "fuzz_check.h"

using namespace fastpipe;

namespace {

constexpr size_t kControl = 4;
constexpr size_t kSpecFields = 4;
constexpr int64_t kMaxReadRecords = 8;

struct TokenType {
  const char* name;
  int bytes;
  bool is_signed;
};
// tokens.py's _TOKEN_DTYPES.
constexpr TokenType kTokenTypes[] = {{"uint8", 1, false}, {"uint16", 2, false}, {"int16", 2, true},
                                     {"int32", 4, true},  {"uint32", 4, false}, {"int64", 8, true}};

int64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  return static_cast<int64_t>(v);
}

int64_t token_at(const uint8_t* file, int64_t offset, int bytes, bool is_signed) {
  uint64_t v = 0;
  for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | file[offset + k];
  if (is_signed && bytes < 8 && (v >> (8 * bytes - 1)) & 1) v |= ~uint64_t{0} << (8 * bytes);
  return static_cast<int64_t>(v);
}

// Reads records `idx` of the opened column through the reader's own gather and compares every output
// byte with the file.
void read_and_compare(const std::vector<Column>& columns, const std::vector<int64_t>& idx, const uint8_t* file,
                      int64_t size) {
  const Column& col = columns[0];
  const ColumnSpec& s = col.spec;
  const auto count = static_cast<int64_t>(idx.size());
  for (int64_t i : idx) {
    // In 128 bits: the check must not itself overflow on what the engine let through.
    const __int128 off = static_cast<__int128>(s.data_offset) + static_cast<__int128>(i) * s.record_stride;
    CHECK(off >= 0 && off + s.record_bytes <= size);
  }
  const int64_t out_bytes = col.output_record_bytes();
  std::vector<char> out(static_cast<size_t>(count * out_bytes * col.num_outputs()) + 1);
  ThreadBuffers tb = thread_buffers(columns, count);
  const Sink sink{&col, out.data(), out_bytes, count * out_bytes, idx.data(), 0};
  read_records(col, idx.data(), count, sink, tb);

  for (int64_t k = 0; k < count; ++k) {
    const int64_t off = s.data_offset + idx[k] * s.record_stride;
    const char* x = out.data() + k * out_bytes;
    if (!col.widen) {
      CHECK(std::memcmp(x, file + off, static_cast<size_t>(s.record_bytes)) == 0);
      continue;
    }
    const int64_t block = s.record_bytes / s.token_bytes - 1;
    for (int64_t j = 0; j < block; ++j) {
      int64_t xv, yv;
      std::memcpy(&xv, x + 8 * j, 8);
      std::memcpy(&yv, x + count * out_bytes + 8 * j, 8);
      CHECK(xv == token_at(file, off + j * s.token_bytes, s.token_bytes, s.token_signed));
      CHECK(yv == token_at(file, off + (j + 1) * s.token_bytes, s.token_bytes, s.token_signed));
    }
  }
}

fuzz::InputFile input(".tok");
// tmpfs refuses O_DIRECT before Linux 6.6 (the reader then falls back to pread): inputs read with
// io='direct' go where FUZZ_DISK_DIR says, a disk directory, so the aligned bounce-buffer reads run.
fuzz::InputFile direct_input(".tok", "FUZZ_DISK_DIR");

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kControl) return 0;
  const uint8_t flags = data[0];
  const bool is_npy = flags & 1;
  const IoMode modes[] = {IoMode::kMmap, IoMode::kPread, IoMode::kDirect, IoMode::kMmap};
  const IoMode mode = modes[(flags >> 1) & 3];
  const bool spec_mode = flags & 8;
  const uint8_t type_byte = data[1];
  const int64_t block_size = data[2] | (data[3] << 8);
  data += kControl;
  size -= kControl;

  ColumnSpec spec;
  if (spec_mode) {
    if (size < 8 * kSpecFields) return 0;
    spec.data_offset = le64(data);
    spec.record_stride = le64(data + 8);
    spec.record_bytes = le64(data + 16);
    spec.num_records = le64(data + 24);
    spec.token_bytes = type_byte;
    spec.token_signed = flags & 16;
    data += 8 * kSpecFields;
    size -= 8 * kSpecFields;
  }
  const std::string& path = (mode == IoMode::kDirect ? direct_input : input).write(data, size);
  const auto file_size = static_cast<int64_t>(size);

  if (!spec_mode) {
    // TokenDataset.__init__ and _columns; each `return 0` is one of its ValueErrors.
    if (block_size < 1) return 0;
    const TokenType* type = nullptr;
    int64_t offset = 0, ntokens = 0;
    if (is_npy) {
      NpyHeader h;
      try {
        h = read_npy_header(path);
      } catch (const Error& e) {
        CHECK(e.kind() == ErrorKind::kValue);
        return 0;
      }
      for (const TokenType& t : kTokenTypes)
        if (h.dtype == t.name) type = &t;
      if (h.shape.size() != 1 || type == nullptr) return 0;
      offset = h.data_offset;
      ntokens = h.shape[0];
    } else {
      type = &kTokenTypes[type_byte % 6];
      if (file_size % type->bytes) return 0;
      ntokens = file_size / type->bytes;
    }
    if (ntokens < block_size + 1) return 0;
    spec.data_offset = offset;
    spec.record_stride = block_size * type->bytes;
    spec.record_bytes = (block_size + 1) * type->bytes;
    spec.num_records = (ntokens - 1) / block_size;
    spec.token_bytes = type->bytes;
    spec.token_signed = type->is_signed;
  }
  spec.path = path;

  // BatchReader's own checks before it opens a column; it opens none for records of no bytes.
  if (spec.record_bytes < 0 || (spec.record_bytes == 0 && !spec.token_bytes)) return 0;
  std::vector<Column> columns;
  try {
    columns.push_back(open_column(spec, mode, false));
  } catch (const Error& e) {
    // What TokenDataset let through, the engine must open.
    CHECK(spec_mode && e.kind() == ErrorKind::kValue);
    return 0;
  }
  const int64_t n = columns[0].spec.num_records;
  if (n <= 0) return 0;
  std::vector<int64_t> idx = {0, n - 1};
  for (int64_t k = 1; k + 1 < kMaxReadRecords && k < n; ++k) idx.push_back(n / kMaxReadRecords * k);
  read_and_compare(columns, idx, data, file_size);
  return 0;
}
