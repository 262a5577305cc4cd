// Remote objects over HTTP(S), S3 included: HEADs and ranged GETs through libcurl's multi interface,
// many requests in flight from the calling thread (connections reused), each retried with backoff and
// jitter on 5xx, 429, timeouts, stalls and resets and resumed at the byte it stopped at. Built when
// libcurl's headers are found (FASTPIPE_WITH_CURL, see setup.py); otherwise every call throws, saying how
// to build it in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/function_ref.h"
#include "core/sigv4.h"

namespace fastpipe {

bool http_available();

struct RemoteObject {
  std::string name;  // what messages call it: the user's URL (s3://bucket/key, https://...)
  std::string url;   // the request URL (path encoded)
  std::string host;  // the Host header as sent: host[:port]
  std::string path;  // the encoded request path (what SigV4 signs)
  // A block of an object: its bytes [offset, offset + the ObjectInfo's size) of the object_size bytes
  // the object holds (-1: the whole object; offset 0).
  int64_t offset = 0;
  int64_t object_size = -1;
};

struct RemoteAuth {
  bool sign = false;  // SigV4 (S3); false: anonymous
  std::string region;
  AwsCredentials credentials;
};

struct TransferOptions {
  int max_in_flight = 16;            // requests at once, over all objects
  int64_t part_bytes = 8 << 20;      // one ranged GET
  int max_attempts = 8;              // per request, the first included
  double backoff_s = 0.2;            // first retry's delay; doubles, capped, times a jitter in [0.5, 1)
  double backoff_max_s = 8.0;
  double connect_timeout_s = 10.0;
  double stall_timeout_s = 30.0;     // a transfer that receives nothing this long is retried
};

struct TransferStats {
  int64_t bytes = 0;     // body bytes received and written
  int64_t requests = 0;  // requests sent (retries included)
  int64_t retries = 0;
  double seconds = 0;    // wall time spent in head() and fetch()
};

struct ObjectInfo {
  int64_t size = -1;
  std::string etag;     // as the server quotes it, "" when it sends none
  bool ranges = false;  // Accept-Ranges: bytes
};

// The bytes of each part of an object (the last one may be shorter): part_bytes, or the whole object
// where the server takes no ranges.
inline int64_t part_span(const ObjectInfo& info, int64_t part_bytes) {
  return info.ranges ? std::max<int64_t>(part_bytes, 1) : std::max<int64_t>(info.size, 1);
}

// Bytes [begin, end) of object `object`'s file (a block's file: from its first byte).
struct Part {
  size_t object = 0;
  int64_t begin = 0, end = 0;
};

// What HttpTransfers::fetch requests, in the order it asks for them, and what becomes of each. Called on
// the fetching thread only.
class PartFeed {
 public:
  virtual ~PartFeed() = default;
  // Up to `want` more parts to request now (none: the fetch ends once those in flight are done). Asked
  // whenever a request slot is free and nothing waits to be sent, so that the order follows the
  // caller's needs as they change.
  virtual void more(size_t want, std::vector<Part>& out) = 0;
  virtual int fd(size_t object) const = 0;  // where the object's bytes are written (at file offsets)
  virtual const std::string& file(size_t object) const = 0;  // its name, for messages
  virtual void written(const Part& part) = 0;
  // The object cannot be fetched (`why` names it and the cause); its other parts are dropped. May throw,
  // which ends fetch() with that exception.
  virtual void failed(size_t object, const std::string& why) = 0;
};

class HttpTransfers {
 public:
  HttpTransfers(RemoteAuth auth, TransferOptions options);
  ~HttpTransfers();
  HttpTransfers(const HttpTransfers&) = delete;
  HttpTransfers& operator=(const HttpTransfers&) = delete;

  // `check` runs every ~100 ms while waiting (it may throw: an interrupt).
  std::vector<ObjectInfo> head(const std::vector<RemoteObject>& objects, FunctionRef<void()> check);

  // The parts `feed` asks for, up to max_in_flight at once, until it asks for none and none is in
  // flight: each a ranged GET (the whole object in one when the server takes no ranges), sent with
  // If-Match (an object changed on the server is an error, never mixed with its old bytes), its body
  // written at its offsets. Errors name the object and the cause.
  void fetch(const std::vector<RemoteObject>& objects, const std::vector<ObjectInfo>& infos, PartFeed& feed,
             FunctionRef<void()> check);

  // From any thread: a fetch in progress asks its feed for parts now (a reader waits for one).
  void wake();

  TransferStats stats() const;
  const TransferOptions& options() const;

 private:
  struct Engine;
  std::unique_ptr<Engine> engine_;
};

}  // namespace fastpipe
