// What fastpipe's libcurl requests share (core/http_fetch.cpp's GETs and HEADs, core/http_put.cpp's
// PUTs): libcurl's one-time initialisation, and what a status or an error means to them (whether to
// retry, what to tell the user, which errno to raise). Included where libcurl is built in only.
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <mutex>
#include <random>
#include <string>

#include "core/http_fetch.h"

namespace fastpipe {

inline void init_curl() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// The settings every request takes: no signals, its error message into `error` (CURL_ERROR_SIZE bytes),
// the connect timeout, a stall of stall_timeout_s ended (then retried), fastpipe's user agent.
inline void set_request_options(CURL* e, const TransferOptions& options, char* error) {
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, long(options.connect_timeout_s * 1000));
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, std::max(1L, long(std::ceil(options.stall_timeout_s))));
  curl_easy_setopt(e, CURLOPT_USERAGENT, "fastpipe");
}

// Seconds to wait before retrying a request that failed `attempts` times: backoff_s doubled each time,
// capped at backoff_max_s, times a jitter in [0.5, 1).
template <class Rng>
double retry_delay(const TransferOptions& options, int attempts, Rng& rng) {
  const double base = std::min(options.backoff_max_s, options.backoff_s * std::ldexp(1.0, attempts - 1));
  return base * std::uniform_real_distribution<double>(0.5, 1.0)(rng);
}

inline bool retryable_status(long s) { return s == 408 || s == 429 || s == 500 || s == 502 || s == 503 || s == 504; }

inline bool retryable_curl(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

// What a failed status means to a user.
inline std::string status_reason(long s) {
  switch (s) {
    case 301:
    case 307:
      return "redirected (an S3 bucket in another region than the request's: set storage_options "
             "region or endpoint_url)";
    case 400:
      return "bad request";
    case 401:
    case 403:
      return "access denied (check the credentials, or storage_options anon=True for a public object)";
    case 404:
      return "not found";
    case 405:
      return "the server does not take this method";
    case 412:
      return "changed on the server while it was being fetched (its ETag no longer matches)";
    case 416:
      return "the server refused the byte range (the object is shorter than its HEAD said)";
    default:
      return retryable_status(s) ? "the server kept failing" : "unexpected status";
  }
}

// The errno a failed status stands for, so that Python raises what it raises for a local file (and
// s3fs for an object): FileNotFoundError for 404, PermissionError for 401 and 403; 0: plain OSError.
inline int status_errno(long s) { return s == 404 ? ENOENT : (s == 401 || s == 403) ? EACCES : 0; }

}  // namespace fastpipe
