// libFuzzer harness of the .npy header parser (csrc/core/npy.cpp). The input is a whole .npy file. It
// is parsed twice: in memory (parse_npy_header) and through a real file (read_npy_header, the path
// every dataset takes, with its own second read for headers past its first 4 KiB). A fastpipe::Error
// of the expected kind is a clean end; any other exception, a sanitizer report or a broken invariant
// of an accepted header (__builtin_trap) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/dtypes.h"
#include "core/error.h"
#include "core/npy.h"
#include "fuzz_file.h"
#include "fuzz_check.h"

using fastpipe::Error;
using fastpipe::ErrorKind;
using fastpipe::NpyHeader;

namespace {

// What a caller may rely on when a header is accepted: the data lies inside the file, its size is
// exactly itemsize * prod(shape) without overflow, and the dtype is one of the table's.
void check_accepted(const NpyHeader& h, int64_t file_size) {
  CHECK(h.major >= 1 && h.major <= 3 && h.minor == 0);
  CHECK(h.file_size == file_size);
  CHECK(h.data_offset >= (h.major == 1 ? 10 : 12) && h.data_offset <= file_size);
  CHECK(h.data_bytes >= 0 && h.data_bytes <= file_size - h.data_offset);
  const fastpipe::Dtype* d = fastpipe::find_dtype(h.dtype);
  CHECK(d != nullptr && d->itemsize == h.itemsize);
  CHECK(h.descr.size() >= 2 && h.descr.substr(1) == d->npy_code);
  CHECK(!h.shape.empty());
  int64_t bytes = h.itemsize;
  for (int64_t dim : h.shape) {
    CHECK(dim >= 0);
    CHECK(!__builtin_mul_overflow(bytes, dim, &bytes));
  }
  CHECK(bytes == h.data_bytes);
}

bool same(const NpyHeader& a, const NpyHeader& b) {
  return a.major == b.major && a.descr == b.descr && a.dtype == b.dtype && a.shape == b.shape &&
         a.data_offset == b.data_offset && a.data_bytes == b.data_bytes && a.file_size == b.file_size;
}

fuzz::InputFile input(".npy");

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file_size = static_cast<int64_t>(size);
  NpyHeader mem;
  bool mem_ok = false;
  try {
    mem = fastpipe::parse_npy_header(reinterpret_cast<const char*>(data), size, file_size, "fuzz.npy");
    mem_ok = true;
    check_accepted(mem, file_size);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kValue);  // nothing is read: a defect can only be the header's
  }

  const std::string& path = input.write(data, size);
  try {
    const NpyHeader disk = fastpipe::read_npy_header(path);
    check_accepted(disk, file_size);
    // Both entries judge the same bytes: they must agree.
    CHECK(mem_ok && same(mem, disk));
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kValue && !mem_ok);
  }
  return 0;
}
