// Python bindings of the remote shards: staging objects from S3 or HTTP(S) into the local cache
// (core/shard_cache.h over core/http_fetch.h), without the GIL and interruptible; and the signing
// primitives, exposed for the tests that compare them with hashlib and botocore.
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "core/http_fetch.h"
#include "core/sha256.h"
#include "core/shard_cache.h"
#include "core/sigv4.h"
#include "ops/bindings.h"
#include "ops/interruptible.h"

namespace py = pybind11;

namespace fastpipe {

void bind_remote(py::module& m) {
  m.attr("HTTP_AVAILABLE") = http_available();
  m.def(
      "stage_shards",
      [](const std::vector<std::tuple<std::string, std::string, std::string, std::string>>& objects,
         const std::string& cache_dir, int64_t cache_limit, bool sign, const std::string& region,
         const std::string& access_key, const std::string& secret_key, const std::string& session_token,
         int max_in_flight, int64_t part_bytes, int max_attempts, double backoff_s, double connect_timeout_s,
         double stall_timeout_s) {
        std::vector<RemoteObject> objs;
        for (const auto& [name, url, host, path] : objects) objs.push_back({name, url, host, path});
        TransferOptions options;
        options.max_in_flight = max_in_flight;
        options.part_bytes = part_bytes;
        options.max_attempts = max_attempts;
        options.backoff_s = backoff_s;
        options.backoff_max_s = std::max(backoff_s, options.backoff_max_s);
        options.connect_timeout_s = connect_timeout_s;
        options.stall_timeout_s = stall_timeout_s;
        HttpTransfers http(RemoteAuth{sign, region, {access_key, secret_key, session_token}}, options);
        const StagedShards staged = interruptible([&](const std::function<void()>& poll) {
          return stage_shards(objs, http, cache_dir, cache_limit, poll);
        });
        const TransferStats t = http.stats();
        py::dict d;
        d["paths"] = staged.paths;
        std::vector<int64_t> sizes;
        std::vector<std::string> etags;
        for (const auto& i : staged.infos) sizes.push_back(i.size), etags.push_back(i.etag);
        d["sizes"] = sizes;
        d["etags"] = etags;
        d["cache_hits"] = staged.hits;
        d["shards_fetched"] = staged.fetched;
        d["shards_waited"] = staged.waited;
        d["evicted_bytes"] = staged.evicted_bytes;
        d["bytes_fetched"] = t.bytes;
        d["requests"] = t.requests;
        d["retries"] = t.retries;
        d["network_seconds"] = t.seconds;
        return d;
      },
      py::arg("objects"), py::arg("cache_dir"), py::arg("cache_limit"), py::arg("sign"), py::arg("region"),
      py::arg("access_key"), py::arg("secret_key"), py::arg("session_token"), py::arg("max_in_flight"),
      py::arg("part_bytes"), py::arg("max_attempts"), py::arg("backoff_s"), py::arg("connect_timeout_s"),
      py::arg("stall_timeout_s"));
  m.def("_sha256", [](py::bytes data) { return to_hex(sha256(data)); });
  m.def("_hmac_sha256", [](py::bytes key, py::bytes msg) { return to_hex(hmac_sha256(key, msg)); });
  m.def(
      "_sigv4_sign",
      [](const std::string& method, const std::string& path, const std::vector<std::pair<std::string, std::string>>& headers,
         const std::string& region, const std::string& access_key, const std::string& secret_key,
         const std::string& session_token, const std::string& amz_date) {
        std::vector<HttpHeader> h;
        for (const auto& [k, v] : headers) h.push_back({k, v});
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& a : sigv4_sign(method, path, h, region, {access_key, secret_key, session_token}, amz_date))
          out.emplace_back(a.name, a.value);
        return out;
      });
  m.def("_uri_encode", &uri_encode, py::arg("text"), py::arg("keep_slash"));
  m.def("_cache_file_name", [](const std::string& name, const std::string& etag, int64_t size) {
    return cache_file_name(name, ObjectInfo{size, etag, false});
  });
}

}  // namespace fastpipe
