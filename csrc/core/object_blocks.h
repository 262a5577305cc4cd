// Blocks of remote objects: byte ranges fetched and cached as objects of their own (a WebDataset larger
// than its cache streams blocks of whole samples through it: core/shard_stream.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/http_fetch.h"

namespace fastpipe {

struct ObjectBlocks {
  std::vector<RemoteObject> objects;
  std::vector<ObjectInfo> infos;
};

// Block b: bytes [begin[b], end[b]) of objects[shard[b]], named "<its name> (bytes a-b)", under the
// object's ETag (a changed object is refused, never mixed). Error(kValue) for a range outside its object.
ObjectBlocks object_blocks(const std::vector<RemoteObject>& objects, const std::vector<ObjectInfo>& infos,
                           const std::vector<int32_t>& shard, const std::vector<int64_t>& begin,
                           const std::vector<int64_t>& end);

}  // namespace fastpipe
