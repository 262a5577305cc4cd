// libFuzzer harness of indexing a WebDataset shard (csrc/core/tar_index.cpp), as fastpipe.WebDataset
// does at construction: the tar headers (ustar, GNU long names, pax records, base-256 sizes), the grouping
// of members into samples, the label members (decimal, or a JSON object's field) and the image headers. Input: the shard. A clean end is an
// index or an Error; a sanitizer report or a broken invariant (__builtin_trap) is a finding.
// Invariants: every member and every sample's image lies inside the file, members are in file order
// without overlap, and the index's per-sample arrays agree in length.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/record_source.h"
#include "core/tar_index.h"
#include "fuzz_check.h"
#include "fuzz_file.h"

using namespace fastpipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::InputFile file(".tar");
  const std::string& path = file.write(data, size);
  const auto n = static_cast<int64_t>(size);
  try {
    const std::vector<TarMember> members = read_tar_members(*open_record_source(path, IoMode::kPread));
    int64_t end = 0;
    for (const TarMember& m : members) {
      CHECK(m.offset >= end && m.offset % 512 == 0 && m.size >= 0 && m.offset + m.size <= n);
      end = m.offset + m.size;
    }
  } catch (const Error&) {
  }
  // Labels from .cls members, and from the "label" field of .json members (core/json_field.cpp).
  for (const char* ext : {"cls", "json"}) {
    try {
      const WebDatasetIndex x = index_webdataset({path}, {"jpg", "png", "webp"}, ext, ext[0] == 'j' ? "label" : "", 1);
      const size_t count = x.offsets.size();
      CHECK(x.sizes.size() == count && x.labels.size() == count && x.shard_of.size() == count &&
            x.heights.size() == count && x.key_offsets.size() == count + 1 && x.without_image.size() == 1);
      for (size_t i = 0; i < count; ++i) {
        CHECK(x.offsets[i] >= 0 && x.sizes[i] >= 0 && x.offsets[i] + x.sizes[i] <= n && x.labels[i] >= 0);
        CHECK(x.key_offsets[i + 1] > x.key_offsets[i]);
      }
      CHECK(x.key_offsets.back() == static_cast<int64_t>(x.keys.size()));
    } catch (const Error&) {
    }
  }
  return 0;
}
