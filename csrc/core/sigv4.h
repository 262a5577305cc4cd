// AWS Signature Version 4 for the S3 requests fastpipe makes (GET and HEAD of one object, and PUT of a
// published index; no query): https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html. Tested
// against botocore's S3SigV4Auth on the same requests.
#pragma once

#include <string>
#include <vector>

namespace fastpipe {

struct AwsCredentials {
  std::string access_key, secret_key, session_token;  // session_token: temporary credentials only
};

struct HttpHeader {
  std::string name, value;
};

// s percent-encoded as SigV4 and S3 want it: A-Z a-z 0-9 - _ . ~ kept, '/' kept when keep_slash, every
// other byte %XX (upper-case hex).
std::string uri_encode(const std::string& s, bool keep_slash);

// "YYYYMMDDTHHMMSSZ", the request's time in UTC.
std::string amz_date_now();

// The headers to add to a request so that S3 accepts it: x-amz-date, x-amz-content-sha256 (the body's
// SHA-256 in hex, `payload_hash`; empty: of the empty body), x-amz-security-token when the credentials
// have one, and Authorization, which signs these and `headers` (host among them, as sent:
// "host[:port]"). `path` is the encoded request path.
std::vector<HttpHeader> sigv4_sign(const std::string& method, const std::string& path,
                                   const std::vector<HttpHeader>& headers, const std::string& region,
                                   const AwsCredentials& credentials, const std::string& amz_date,
                                   const std::string& payload_hash = "");

}  // namespace fastpipe
