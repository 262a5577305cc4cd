// WebDataset shards: the regular files of a tar archive, and its samples (members grouped by key as the
// webdataset package groups them) with what an image column needs of each: where its image member's
// bytes are, its label, and its image header's size. Every length and offset in a header is checked
// against the archive before it is used: a malformed or truncated shard is an error naming it and the
// offset of the header at fault, never a read outside it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/record_source.h"

namespace fastpipe {

struct TarMember {
  std::string name;  // the pax path, else the GNU long name, else ustar's prefix/name
  int64_t offset;    // of its data in the archive
  int64_t size;
};

// The regular files of the tar archive `f` holds, in archive order (ustar, GNU and pax archives; other
// entry types such as directories and links are skipped). The archive ends at its first zero block or
// where the file ends between two entries. Error(kValue) for a malformed header or an archive cut
// short, Error(kIO) for a failed read.
std::vector<TarMember> read_tar_members(const RecordSource& f);

// webdataset's split of a member name into key and extension: the key runs up to the first dot of the
// name's last path component, the extension is the rest (lowercased). False for a name without one.
bool split_webdataset_name(const std::string& name, std::string* key, std::string* extension);

// The samples of shards[k] for every k, in shard order then archive order. A sample's image is its
// first member whose last extension component is one of image_extensions (e.g. "jpg"; the format is
// then told by content); its label is the decimal integer its `label_extension` member holds, or with a
// `label_field`, that top-level field of the JSON object the member holds (core/json_field.h).
struct WebDatasetIndex {
  std::vector<int32_t> shard_of;
  std::vector<int64_t> offsets, sizes;   // the image member's data
  std::vector<int64_t> labels;
  std::string keys;                      // the samples' keys, concatenated
  std::vector<int64_t> key_offsets;      // sample i's key: keys[key_offsets[i], key_offsets[i + 1])
  std::vector<int32_t> heights, widths;  // from the image's header; 0 where it cannot be read
  std::vector<int8_t> formats;           // ImageFormat
  std::vector<int64_t> bad;              // samples whose image cannot be decoded (they stay in the list)
  std::vector<std::string> reasons;      // why, per entry of bad
  std::vector<int64_t> without_image;    // per shard: samples skipped because no member is an image
};

// Indexes the shards with `threads` threads. Error(kValue) naming the shard for a malformed archive, a
// sample holding two members of one extension (as webdataset refuses), or a missing or non-integer
// label (or malformed JSON); Error(kIO) for a shard that cannot be read.
WebDatasetIndex index_webdataset(const std::vector<std::string>& shards, const std::vector<std::string>& image_extensions,
                                 const std::string& label_extension, const std::string& label_field, int threads);

}  // namespace fastpipe
