#include "core/object_blocks.h"

#include <string>
#include <utility>

#include "core/error.h"

namespace fastpipe {

ObjectBlocks object_blocks(const std::vector<RemoteObject>& objects, const std::vector<ObjectInfo>& infos,
                           const std::vector<int32_t>& shard, const std::vector<int64_t>& begin,
                           const std::vector<int64_t>& end) {
  FP_CHECK_VALUE(shard.size() == begin.size() && shard.size() == end.size(),
                 "blocks need a shard, a begin and an end each");
  ObjectBlocks out;
  for (size_t b = 0; b < shard.size(); ++b) {
    FP_CHECK_VALUE(shard[b] >= 0 && size_t(shard[b]) < objects.size(),
                   "block " + std::to_string(b) + " names shard " + std::to_string(shard[b]));
    const RemoteObject& o = objects[shard[b]];
    const ObjectInfo& info = infos[shard[b]];
    FP_CHECK_VALUE(0 <= begin[b] && begin[b] < end[b] && end[b] <= info.size,
                   "block " + std::to_string(b) + " of '" + o.name + "' is bytes [" + std::to_string(begin[b]) + ", " +
                       std::to_string(end[b]) + "), outside its " + std::to_string(info.size) + " bytes");
    RemoteObject block = o;
    block.name = o.name + " (bytes " + std::to_string(begin[b]) + "-" + std::to_string(end[b] - 1) + ")";
    block.offset = begin[b];
    block.object_size = info.size;
    out.objects.push_back(std::move(block));
    out.infos.push_back({end[b] - begin[b], info.etag, info.ranges});
  }
  return out;
}

}  // namespace fastpipe
