#include "core/http_put.h"

#include "core/error.h"

#ifdef FASTPIPE_WITH_CURL

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <random>
#include <thread>
#include <vector>

#include "core/curl_common.h"
#include "core/sha256.h"

namespace fastpipe {
namespace {

using Clock = std::chrono::steady_clock;

struct Upload {
  const std::string* body;
  size_t sent = 0;
  std::string error_body;  // the start of a failed answer's body (S3's XML)
  FunctionRef<void()>* check;
  std::exception_ptr thrown;  // by check, which cannot cross libcurl
  Clock::time_point last_check;
};

size_t read_body(char* out, size_t size, size_t n, void* p) {
  auto* u = static_cast<Upload*>(p);
  const size_t take = std::min(size * n, u->body->size() - u->sent);
  std::memcpy(out, u->body->data() + u->sent, take);
  u->sent += take;
  return take;
}

size_t keep_answer(char* data, size_t size, size_t n, void* p) {
  auto* u = static_cast<Upload*>(p);
  u->error_body.append(data, std::min(size * n, size_t(512) - std::min(size_t(512), u->error_body.size())));
  return size * n;
}

int progress(void* p, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* u = static_cast<Upload*>(p);
  if (Clock::now() - u->last_check < std::chrono::milliseconds(100)) return 0;
  u->last_check = Clock::now();
  try {
    (*u->check)();
  } catch (...) {
    u->thrown = std::current_exception();
    return 1;  // aborts the transfer
  }
  return 0;
}

struct Easy {
  CURL* e = curl_easy_init();
  curl_slist* headers = nullptr;
  ~Easy() {
    curl_slist_free_all(headers);
    if (e) curl_easy_cleanup(e);
  }
};

}  // namespace

void http_put(const RemoteObject& object, const std::string& body, const RemoteAuth& auth,
              const TransferOptions& options, FunctionRef<void()> check) {
  init_curl();
  const std::string what = "'" + object.name + "': uploading it: ";
  const std::string body_hash = auth.sign ? to_hex(sha256(body)) : std::string();
  std::mt19937_64 rng{std::random_device{}()};
  for (int attempt = 1;; ++attempt) {
    Easy easy;
    if (!easy.e) throw Error(ErrorKind::kIO, what + "libcurl could not create a transfer (out of memory?)");
    std::vector<HttpHeader> headers = {{"host", object.host}};
    if (auth.sign) {
      const auto added = sigv4_sign("PUT", object.path, headers, auth.region, auth.credentials, amz_date_now(),
                                    body_hash);
      headers.insert(headers.end(), added.begin(), added.end());
    }
    for (const auto& h : headers) easy.headers = curl_slist_append(easy.headers, (h.name + ": " + h.value).c_str());
    easy.headers = curl_slist_append(easy.headers, "Expect:");
    Upload up{&body, 0, {}, &check, nullptr, Clock::now()};
    char curl_error[CURL_ERROR_SIZE] = {0};
    CURL* e = easy.e;
    curl_easy_setopt(e, CURLOPT_URL, object.url.c_str());
    curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, curl_off_t(body.size()));
    curl_easy_setopt(e, CURLOPT_READFUNCTION, &read_body);
    curl_easy_setopt(e, CURLOPT_READDATA, &up);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &keep_answer);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &up);
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, &progress);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, &up);
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, easy.headers);
    set_request_options(e, options, curl_error);
    const CURLcode code = curl_easy_perform(e);
    if (up.thrown) std::rethrow_exception(up.thrown);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    if (code == CURLE_OK && status >= 200 && status < 300) return;
    std::string why = code != CURLE_OK ? std::string(curl_error[0] ? curl_error : curl_easy_strerror(code))
                                       : "HTTP " + std::to_string(status) + ", " + status_reason(status);
    if (!up.error_body.empty() && code == CURLE_OK) why += " (the server said: " + quoted_bytes(up.error_body, 300) + ")";
    const bool retry = code != CURLE_OK ? retryable_curl(code) : retryable_status(status);
    if (!retry || attempt >= options.max_attempts)
      throw Error(ErrorKind::kIO, what + why + (retry ? " (" + std::to_string(attempt) + " attempts)" : ""),
                  code == CURLE_OK ? status_errno(status) : 0);
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(retry_delay(options, attempt, rng)));
    while (Clock::now() < until) {
      check();
      std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(100)));
    }
  }
}

}  // namespace fastpipe

#else  // no libcurl

namespace fastpipe {

void http_put(const RemoteObject& object, const std::string&, const RemoteAuth&, const TransferOptions&,
              FunctionRef<void()>) {
  throw Error(ErrorKind::kValue, "'" + object.name + "': this fastpipe was built without libcurl, so it cannot upload to "
                                 "s3:// or http(s):// URLs");
}

}  // namespace fastpipe

#endif
