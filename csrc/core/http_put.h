// One object uploaded with a PUT over HTTP(S) or S3 (signed with its body's SHA-256): what a WebDataset
// publishes its index with (fastpipe/data/webdataset_index.py). Retried as the fetches are
// (core/http_fetch.h: 5xx, 429, timeouts and resets, with backoff and jitter, options.max_attempts in
// all); any other failure is an Error naming the object and the cause, with the errno a local file's
// failure would have (PermissionError for 401 and 403). Built with libcurl only, as the fetches are.
#pragma once

#include <string>

#include "core/function_ref.h"
#include "core/http_fetch.h"

namespace fastpipe {

// `check` runs every ~100 ms while the request is under way (it may throw: an interrupt).
void http_put(const RemoteObject& object, const std::string& body, const RemoteAuth& auth,
              const TransferOptions& options, FunctionRef<void()> check);

}  // namespace fastpipe
