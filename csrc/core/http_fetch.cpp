#include "core/http_fetch.h"

#include "core/error.h"

#ifdef FASTPIPE_WITH_CURL

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <unordered_map>
#include <utility>

#include "core/curl_common.h"

namespace fastpipe {
namespace {

using Clock = std::chrono::steady_clock;

// One request: a HEAD, or a GET of [begin, end) of an object of which `got` bytes have arrived.
struct Request {
  size_t object = 0;
  bool head = false;
  int64_t begin = 0, end = 0, got = 0;
  int attempts = 0;
  Clock::time_point not_before{};
  // This attempt's response.
  long status = 0;
  int64_t body_at = -1;  // the object offset of the response body's first byte (Content-Range), once known
  int64_t body_seen = 0;
  bool have_all = false;  // stopped on purpose after the last byte wanted (a server that ignored Range)
  bool bad_range = false;  // a 206 without a Content-Range
  int write_errno = 0;
  std::string etag, content_range, error_body;
  int64_t content_length = -1;
  bool accept_ranges = false;
  char curl_error[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = nullptr;

  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() { curl_slist_free_all(headers); }
};

using Requests = std::deque<std::unique_ptr<Request>>;

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}


}  // namespace

struct HttpTransfers::Engine {
  RemoteAuth auth;
  TransferOptions options;
  TransferStats stats;
  CURLM* multi = nullptr;
  std::vector<CURL*> idle;  // easy handles kept for reuse (their connections stay in the multi's cache)
  std::mt19937 rng{std::random_device{}()};

  // The current run's objects, and where their bodies go (none for HEADs).
  const std::vector<RemoteObject>* objects = nullptr;
  const std::vector<ObjectInfo>* infos = nullptr;
  PartFeed* feed = nullptr;
  std::atomic<bool> poked{false};  // wake(): ask the feed for parts now

  ~Engine() {
    for (CURL* e : idle) curl_easy_cleanup(e);
    if (multi) curl_multi_cleanup(multi);
  }

  static size_t on_header(char* data, size_t size, size_t n, void* p) {
    auto* r = static_cast<Request*>(p);
    const std::string line(data, size * n);
    if (line.rfind("HTTP/", 0) == 0) {  // a new response (after a 100 Continue or a redirect): start over
      r->etag.clear(), r->content_range.clear(), r->content_length = -1, r->accept_ranges = false;
      return size * n;
    }
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return size * n;
    const std::string key = lower(line.substr(0, colon));
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r\n") + 1);
    if (key == "etag") r->etag = value;
    if (key == "content-range") r->content_range = value;
    if (key == "content-length") r->content_length = std::strtoll(value.c_str(), nullptr, 10);
    if (key == "accept-ranges") r->accept_ranges = lower(value) == "bytes";
    return size * n;
  }

  struct WriteTarget {
    Engine* engine;
    Request* request;
    CURL* easy;
  };

  static size_t on_body(char* data, size_t size, size_t n, void* p) {
    auto* t = static_cast<WriteTarget*>(p);
    Request& r = *t->request;
    const size_t len = size * n;
    if (r.status == 0) curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &r.status);
    if (r.status != 200 && r.status != 206) {  // keep the start of an error body (S3's XML) for the message
      r.error_body.append(data, std::min(len, size_t(512) - std::min(size_t(512), r.error_body.size())));
      return len;
    }
    if (r.body_at < 0) {
      r.body_at = 0;  // 200: the whole object
      long long a = 0;
      if (r.status == 206) {
        if (std::sscanf(r.content_range.c_str(), "bytes %lld-", &a) != 1) {
          r.bad_range = true;  // where these bytes belong is unknown: none is written
          return 0;
        }
        r.body_at = a;
      }
    }
    // Write what continues [begin + got, end) contiguously; skip what comes before it (a server that
    // ignored Range); stop once past the end.
    const int64_t from = r.body_at + r.body_seen, to = from + int64_t(len);
    r.body_seen += int64_t(len);
    const int64_t want = r.begin + r.got;
    if (to > want && from <= want) {
      const int64_t skip = want - from;
      const int64_t take = std::min<int64_t>(to, r.end) - want;
      const char* src = data + skip;
      for (int64_t done = 0; done < take;) {
        const ssize_t w = ::pwrite(t->engine->feed->fd(r.object), src + done, size_t(take - done),
                                   want + done - (*t->engine->objects)[r.object].offset);
        if (w < 0) {
          if (errno == EINTR) continue;
          r.write_errno = errno;
          return 0;
        }
        done += w;
      }
      r.got += take;
      t->engine->stats.bytes += take;
    }
    if (r.begin + r.got >= r.end) {
      r.have_all = true;
      return to > r.end ? 0 : len;  // 0 ends a body that runs past the range
    }
    return len;
  }

  CURL* prepare(Request& r, WriteTarget& target) {
    CURL* e = idle.empty() ? curl_easy_init() : idle.back();
    if (!idle.empty()) idle.pop_back();
    if (!e) throw Error(ErrorKind::kIO, "libcurl could not create a transfer (out of memory?)");
    curl_easy_reset(e);
    const RemoteObject& o = (*objects)[r.object];
    r.status = 0, r.body_at = -1, r.body_seen = 0, r.have_all = false, r.bad_range = false, r.write_errno = 0;
    r.etag.clear(), r.content_range.clear(), r.error_body.clear(), r.content_length = -1, r.curl_error[0] = 0;
    std::vector<HttpHeader> headers = {{"host", o.host}};
    if (!r.head) {
      headers.push_back({"range", "bytes=" + std::to_string(r.begin + r.got) + "-" + std::to_string(r.end - 1)});
      const std::string& etag = (*infos)[r.object].etag;
      if (!etag.empty()) headers.push_back({"if-match", etag});
    }
    if (auth.sign) {
      const auto added = sigv4_sign(r.head ? "HEAD" : "GET", o.path, headers, auth.region, auth.credentials,
                                    amz_date_now());
      headers.insert(headers.end(), added.begin(), added.end());
    }
    if (r.headers) curl_slist_free_all(r.headers);
    r.headers = nullptr;
    for (const auto& h : headers) r.headers = curl_slist_append(r.headers, (h.name + ": " + h.value).c_str());
    r.headers = curl_slist_append(r.headers, "Expect:");
    curl_easy_setopt(e, CURLOPT_URL, o.url.c_str());
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r.headers);
    set_request_options(e, options, r.curl_error);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &Engine::on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(e, CURLOPT_PRIVATE, &r);
    if (r.head) {
      curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    } else {
      target = WriteTarget{this, &r, e};
      // Bodies handed over in 512 KiB, not 16: a quarter less CPU per byte fetched (fewer callbacks and
      // writes), on the cores the decoding needs.
      curl_easy_setopt(e, CURLOPT_BUFFERSIZE, long(512 << 10));
      curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &Engine::on_body);
      curl_easy_setopt(e, CURLOPT_WRITEDATA, &target);
    }
    return e;
  }

  struct Failed {  // a request that cannot succeed: its message names the object
    std::string message;
    int error = 0;  // status_errno()
  };

  std::string message(const Request& r, const std::string& why) const {
    std::string msg = "'" + (*objects)[r.object].name + "': " + why;
    if (!r.error_body.empty()) msg += " (the server said: " + quoted_bytes(r.error_body, 300) + ")";
    return msg;
  }

  [[noreturn]] void fail(const Request& r, const std::string& why, int error = 0) const {
    throw Failed{message(r, why), error};
  }

  // How the attempt ended: true when the request is done; false to retry it; throws when it cannot be.
  bool finished(Request& r, CURLcode code) {
    if (r.write_errno != 0) {
      const std::string& file = feed->file(r.object);
      fail(r, "writing its cache file '" + file + "': " + std::strerror(r.write_errno) +
                  (r.write_errno == ENOSPC ? " (the cache's disk is full: free space, or set cache_dir elsewhere)" : ""));
    }
    if (r.bad_range) fail(r, "the server answered a range request with 206 but no Content-Range");
    const std::string& etag = (*infos).empty() ? std::string() : (*infos)[r.object].etag;
    const bool ok_status = r.head ? r.status == 200 : (r.status == 200 || r.status == 206);
    if (code == CURLE_OK || (code == CURLE_WRITE_ERROR && r.have_all)) {
      if (!ok_status) {
        if (retryable_status(r.status)) return false;
        fail(r, "HTTP " + std::to_string(r.status) + ", " + status_reason(r.status), status_errno(r.status));
      }
      if (!r.head && !etag.empty() && !r.etag.empty() && r.etag != etag)
        fail(r, "changed on the server while it was being fetched (ETag " + r.etag + ", was " + etag + ")");
      if (!r.head && r.status == 206) {
        const size_t slash = r.content_range.rfind('/');
        const int64_t total = slash == std::string::npos ? -1 : std::strtoll(r.content_range.c_str() + slash + 1, nullptr, 10);
        const RemoteObject& o = (*objects)[r.object];
        const int64_t size = o.object_size >= 0 ? o.object_size : (*infos)[r.object].size;
        if (total >= 0 && total != size)
          fail(r, "changed on the server while it was being fetched (now " + std::to_string(total) +
                      " bytes, was " + std::to_string(size) + ")");
      }
      return r.head || r.begin + r.got >= r.end;  // a body cut short without an error: resume it
    }
    if (retryable_curl(code)) return false;
    fail(r, std::string("request failed: ") + (r.curl_error[0] ? r.curl_error : curl_easy_strerror(code)));
  }

  // Sends `pending` and the requests `more` adds (asked after each completion, on wake() and every
  // ~100 ms while a slot is free), up to max_in_flight at once, until none is left. done(r) as each one
  // completes; failed(object, message, errno) when one cannot: it may throw, which ends the run, or else the
  // object's other requests are dropped.
  void run(Requests pending, FunctionRef<void(size_t, Requests&)> more, FunctionRef<void(Request&)> done,
           FunctionRef<void(size_t, const std::string&, int)> failed, FunctionRef<void()> check) {
    const auto start = Clock::now();
    const size_t slots = size_t(std::max(1, options.max_in_flight));
    struct Active {
      std::unique_ptr<Request> request;
      std::unique_ptr<WriteTarget> target;
    };
    std::unordered_map<CURL*, Active> active;
    auto release = [&](CURL* e) {
      curl_multi_remove_handle(multi, e);
      active.erase(e);
      idle.push_back(e);
    };
    auto drop = [&](size_t object) {
      pending.erase(std::remove_if(pending.begin(), pending.end(), [&](const auto& r) { return r->object == object; }),
                    pending.end());
      std::vector<CURL*> gone;
      for (const auto& [e, a] : active)
        if (a.request->object == object) gone.push_back(e);
      for (CURL* e : gone) release(e);
    };
    bool ask = true;
    auto asked = Clock::now();
    try {
      for (;;) {
        if (poked.exchange(false) || Clock::now() - asked > std::chrono::milliseconds(100)) ask = true;
        if (ask && active.size() + pending.size() < slots) {
          more(slots - active.size() - pending.size(), pending);
          ask = false, asked = Clock::now();
        }
        if (pending.empty() && active.empty()) break;
        const auto now = Clock::now();
        for (size_t i = 0; i < pending.size() && active.size() < slots;) {
          if (pending[i]->not_before > now) {
            ++i;
            continue;
          }
          std::unique_ptr<Request> r = std::move(pending[i]);
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          auto target = std::make_unique<WriteTarget>();
          CURL* e = prepare(*r, *target);
          ++r->attempts;
          ++stats.requests;
          active.emplace(e, Active{std::move(r), std::move(target)});
          if (curl_multi_add_handle(multi, e) != CURLM_OK) throw Error(ErrorKind::kIO, "libcurl refused a transfer");
        }
        int running = 0;
        curl_multi_perform(multi, &running);
        int left = 0;
        while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
          if (m->msg != CURLMSG_DONE) continue;
          CURL* e = m->easy_handle;
          const auto it = active.find(e);
          if (it == active.end()) continue;  // dropped with its object
          std::unique_ptr<Request> r = std::move(it->second.request);
          const CURLcode code = m->data.result;
          curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
          release(e);
          ask = true;
          const int64_t before = r->got;
          std::optional<Failed> failure;
          try {
            if (finished(*r, code)) {
              done(*r);
              continue;
            }
            // A resumed request that made progress starts its count over: a long object on a flaky
            // link is not failed by resets spread over many parts.
            if (r->got > before) r->attempts = 1;
            if (r->attempts >= options.max_attempts) {
              std::string why;
              if (r->status >= 400)
                why = "HTTP " + std::to_string(r->status) + ", " + status_reason(r->status);
              else if (code == CURLE_OK)
                why = "its answers kept ending before the end of the bytes asked for";
              else
                why = std::string("request failed, last: ") + (r->curl_error[0] ? r->curl_error : curl_easy_strerror(code));
              fail(*r, why + " (" + std::to_string(r->attempts) + " attempts)");
            }
          } catch (const Failed& f) {
            failure = f;
          }
          if (failure) {
            drop(r->object);
            failed(r->object, failure->message, failure->error);
            continue;
          }
          ++stats.retries;
          r->not_before = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(retry_delay(options, r->attempts, rng)));
          pending.push_back(std::move(r));
        }
        if (!pending.empty() || !active.empty()) {
          curl_multi_poll(multi, nullptr, 0, active.empty() ? 20 : 100, nullptr);
          check();
        }
      }
    } catch (...) {
      for (const auto& [e, a] : active) {
        curl_multi_remove_handle(multi, e);
        idle.push_back(e);
      }
      stats.seconds += std::chrono::duration<double>(Clock::now() - start).count();
      throw;
    }
    stats.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
};

bool http_available() { return true; }

HttpTransfers::HttpTransfers(RemoteAuth auth, TransferOptions options) : engine_(std::make_unique<Engine>()) {
  init_curl();
  engine_->auth = std::move(auth);
  engine_->options = options;
  engine_->multi = curl_multi_init();
  if (!engine_->multi) throw Error(ErrorKind::kIO, "libcurl could not start (curl_multi_init failed)");
  curl_multi_setopt(engine_->multi, CURLMOPT_MAX_HOST_CONNECTIONS, long(options.max_in_flight));
}

HttpTransfers::~HttpTransfers() = default;

std::vector<ObjectInfo> HttpTransfers::head(const std::vector<RemoteObject>& objects, FunctionRef<void()> check) {
  std::vector<ObjectInfo> infos(objects.size());
  Requests requests;
  for (size_t k = 0; k < objects.size(); ++k) {
    requests.push_back(std::make_unique<Request>());
    requests.back()->object = k, requests.back()->head = true;
  }
  const std::vector<ObjectInfo> none;
  engine_->objects = &objects, engine_->infos = &none, engine_->feed = nullptr;
  engine_->run(
      std::move(requests), [](size_t, Requests&) {},
      [&](Request& r) {
        if (r.content_length < 0) engine_->fail(r, "the server's answer to HEAD gives no size (Content-Length)");
        infos[r.object] = ObjectInfo{r.content_length, r.etag, r.accept_ranges};
      },
      [](size_t, const std::string& why, int error) { throw Error(ErrorKind::kIO, why, error); }, check);
  return infos;
}

void HttpTransfers::fetch(const std::vector<RemoteObject>& objects, const std::vector<ObjectInfo>& infos,
                          PartFeed& feed, FunctionRef<void()> check) {
  engine_->objects = &objects, engine_->infos = &infos, engine_->feed = &feed;
  std::vector<Part> parts;
  engine_->run(
      {},
      [&](size_t want, Requests& pending) {
        parts.clear();
        feed.more(want, parts);
        for (const Part& p : parts) {
          auto r = std::make_unique<Request>();
          const int64_t first = objects[p.object].offset;
          r->object = p.object, r->begin = first + p.begin, r->end = first + p.end;
          pending.push_back(std::move(r));
        }
      },
      [&](Request& r) {
        const int64_t first = objects[r.object].offset;
        feed.written(Part{r.object, r.begin - first, r.end - first});
      },
      [&](size_t object, const std::string& why, int) { feed.failed(object, why); }, check);
}

void HttpTransfers::wake() {
  engine_->poked = true;
  curl_multi_wakeup(engine_->multi);
}

TransferStats HttpTransfers::stats() const { return engine_->stats; }
const TransferOptions& HttpTransfers::options() const { return engine_->options; }

}  // namespace fastpipe

#else  // no libcurl

namespace fastpipe {

namespace {
[[noreturn]] void unavailable() {
  throw Error(ErrorKind::kValue,
              "this fastpipe was built without libcurl, so it cannot read s3:// or http(s):// URLs: install its "
              "headers (Debian/Ubuntu: apt-get install libcurl4-openssl-dev; `make setup` does it) and reinstall "
              "fastpipe");
}
}  // namespace

struct HttpTransfers::Engine {};
bool http_available() { return false; }
HttpTransfers::HttpTransfers(RemoteAuth, TransferOptions) { unavailable(); }
HttpTransfers::~HttpTransfers() = default;
std::vector<ObjectInfo> HttpTransfers::head(const std::vector<RemoteObject>&, FunctionRef<void()>) { unavailable(); }
void HttpTransfers::fetch(const std::vector<RemoteObject>&, const std::vector<ObjectInfo>&, PartFeed&,
                          FunctionRef<void()>) {
  unavailable();
}
void HttpTransfers::wake() {}
TransferStats HttpTransfers::stats() const { return {}; }
const TransferOptions& HttpTransfers::options() const { unavailable(); }

}  // namespace fastpipe

#endif
