// Python bindings of the remote shards: staging objects from S3 or HTTP(S) into the local cache
// (core/shard_cache.h over core/http_fetch.h) and streaming shards through it (core/shard_stream.h),
// without the GIL and interruptible; uploading one object (core/http_put.h: a published index); and the signing
// primitives, exposed for the tests that compare them with hashlib and botocore.
#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "core/http_fetch.h"
#include "core/http_put.h"
#include "core/sha256.h"
#include "core/shard_cache.h"
#include "core/shard_stream.h"
#include "core/sigv4.h"
#include "ops/bindings.h"
#include "ops/interruptible.h"

namespace py = pybind11;

namespace fastpipe {

namespace {

using ObjectTuple = std::tuple<std::string, std::string, std::string, std::string>;
using AuthTuple = std::tuple<bool, std::string, std::string, std::string, std::string>;

std::vector<RemoteObject> objects_of(const std::vector<ObjectTuple>& objects) {
  std::vector<RemoteObject> out;
  for (const auto& [name, url, host, path] : objects) out.push_back({name, url, host, path});
  return out;
}

// (sign, region, access key, secret key, session token)
RemoteAuth auth_of(const AuthTuple& a) {
  return RemoteAuth{std::get<0>(a), std::get<1>(a), {std::get<2>(a), std::get<3>(a), std::get<4>(a)}};
}

// remote.py's transport settings, checked there.
TransferOptions options_of(const py::dict& t) {
  TransferOptions o;
  o.max_in_flight = t["max_in_flight"].cast<int>();
  o.part_bytes = t["part_size"].cast<int64_t>();
  o.max_attempts = t["max_attempts"].cast<int>();
  o.backoff_s = t["retry_backoff"].cast<double>();
  o.backoff_max_s = std::max(o.backoff_s, o.backoff_max_s);
  o.connect_timeout_s = t["connect_timeout"].cast<double>();
  o.stall_timeout_s = t["stall_timeout"].cast<double>();
  return o;
}

py::dict transfer_dict(const StagedShards& counts, const TransferStats& t) {
  py::dict d;
  d["cache_hits"] = counts.hits;
  d["shards_fetched"] = counts.fetched;
  d["shards_waited"] = counts.waited;
  d["bytes_fetched"] = t.bytes;
  d["requests"] = t.requests;
  d["retries"] = t.retries;
  d["network_seconds"] = t.seconds;
  return d;
}

}  // namespace

void bind_remote(py::module& m) {
  m.attr("HTTP_AVAILABLE") = http_available();
  m.def(
      "stage_shards",
      [](const std::vector<ObjectTuple>& objects, const std::string& cache_dir, int64_t cache_limit,
         const AuthTuple& auth, const py::dict& transport) {
        const std::vector<RemoteObject> objs = objects_of(objects);
        HttpTransfers http(auth_of(auth), options_of(transport));
        const StagedShards staged = interruptible([&](const std::function<void()>& poll) {
          return stage_shards(objs, http, cache_dir, cache_limit, poll);
        });
        py::dict d = transfer_dict(staged, http.stats());
        d["paths"] = staged.paths;
        d["evicted_bytes"] = staged.evicted_bytes;
        return d;
      },
      py::arg("objects"), py::arg("cache_dir"), py::arg("cache_limit"), py::arg("auth"), py::arg("transport"));

  m.def(
      "put_object",
      [](const ObjectTuple& object, const py::bytes& body, const AuthTuple& auth, const py::dict& transport) {
        const RemoteObject obj = objects_of({object})[0];
        const RemoteAuth a = auth_of(auth);
        const TransferOptions o = options_of(transport);
        std::string data = body;
        interruptible([&](const std::function<void()>& poll) {
          http_put(obj, data, a, o, poll);
          return 0;
        });
      },
      py::arg("object"), py::arg("body"), py::arg("auth"), py::arg("transport"));

  py::class_<ShardOpener, std::shared_ptr<ShardOpener>>(
      m, "ShardOpener", "Shards opened by index (core/record_source.h): what ImageSource.members takes as stream.");
  py::class_<ShardStream, ShardOpener, std::shared_ptr<ShardStream>>(
      m, "ShardStream", "Remote shards streaming through a bounded cache (core/shard_stream.h).")
      .def(py::init([](const std::vector<ObjectTuple>& objects, const std::string& cache_dir, int64_t cache_limit,
                       const AuthTuple& auth, const py::dict& transport) {
             const std::vector<RemoteObject> objs = objects_of(objects);
             const RemoteAuth a = auth_of(auth);
             const TransferOptions o = options_of(transport);
             return interruptible([&](const std::function<void()>& poll) {
               return std::make_shared<ShardStream>(objs, a, o, cache_dir, cache_limit, poll);
             });
           }),
           py::arg("objects"), py::arg("cache_dir"), py::arg("cache_limit"), py::arg("auth"), py::arg("transport"))
      .def_property_readonly("paths", &ShardStream::paths)
      .def_property_readonly("sizes",
                             [](const ShardStream& s) {
                               std::vector<int64_t> out;
                               for (const auto& i : s.infos()) out.push_back(i.size);
                               return out;
                             })
      .def_property_readonly("etags",
                             [](const ShardStream& s) {
                               std::vector<std::string> out;
                               for (const auto& i : s.infos()) out.push_back(i.etag);
                               return out;
                             })
      .def_property_readonly("ranges",
                             [](const ShardStream& s) {
                               std::vector<bool> out;
                               for (const auto& i : s.infos()) out.push_back(i.ranges);
                               return out;
                             })
      .def_property_readonly("limit", &ShardStream::limit)
      .def("blocks", &ShardStream::blocks, py::arg("shard"), py::arg("begin"), py::arg("end"),
           py::call_guard<py::gil_scoped_release>())
      .def("plan", &ShardStream::plan, py::arg("order"), py::arg("reads"), py::arg("next") = std::vector<int32_t>{},
           py::arg("need_shard") = std::vector<int32_t>{}, py::arg("need_begin") = std::vector<int64_t>{},
           py::arg("need_end") = std::vector<int64_t>{}, py::call_guard<py::gil_scoped_release>())
      .def(
          "pin",
          [](ShardStream& s, const std::vector<int32_t>& ks) {
            interruptible([&](const std::function<void()>& poll) {
              s.pin(ks, poll);
              return 0;
            });
          },
          py::arg("shards"))
      .def("unpin", &ShardStream::unpin, py::arg("shards"), py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const ShardStream& s) {
        const StreamStats st = s.stats();
        py::dict d = transfer_dict(st.counts, st.transfer);
        d["shards_evicted"] = st.evicted;
        d["shards_fetching"] = st.fetching;
        d["blocked_seconds"] = st.blocked_seconds;
        return d;
      });
  m.def("_sha256", [](py::bytes data) { return to_hex(sha256(data)); });
  m.def("_hmac_sha256", [](py::bytes key, py::bytes msg) { return to_hex(hmac_sha256(key, msg)); });
  m.def(
      "_sigv4_sign",
      [](const std::string& method, const std::string& path, const std::vector<std::pair<std::string, std::string>>& headers,
         const std::string& region, const std::string& access_key, const std::string& secret_key,
         const std::string& session_token, const std::string& amz_date, const std::string& payload_hash) {
        std::vector<HttpHeader> h;
        for (const auto& [k, v] : headers) h.push_back({k, v});
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& a :
             sigv4_sign(method, path, h, region, {access_key, secret_key, session_token}, amz_date, payload_hash))
          out.emplace_back(a.name, a.value);
        return out;
      },
      py::arg("method"), py::arg("path"), py::arg("headers"), py::arg("region"), py::arg("access_key"),
      py::arg("secret_key"), py::arg("session_token"), py::arg("amz_date"), py::arg("payload_hash") = "");
  m.def("_uri_encode", &uri_encode, py::arg("text"), py::arg("keep_slash"));
  m.def("_cache_file_name", [](const std::string& name, const std::string& etag, int64_t size) {
    return cache_file_name(name, ObjectInfo{size, etag, false});
  });
}

}  // namespace fastpipe
