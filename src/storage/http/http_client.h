// HttpClient: blocking HTTP requests over libcurl, with retries, for the object-store
// drivers (S3, GCS; the Azure driver can reuse it with its own Authorization header).
//
// A request names a method, a full URL (already percent-encoded by the caller: the
// signature covers the bytes sent), headers, an optional body (a span the caller keeps
// alive for the call) and where the response body goes (a string, or a caller buffer for
// ranged GETs that land in place). Signing is per request: `aws_sigv4` hands SigV4 to libcurl
// (CURLOPT_AWS_SIGV4 with CURLOPT_USERPWD); other schemes put their own header in.
//
// Retries (RetryPolicy): a response 5xx or 429, or a transport failure (refused or reset
// connection, timeout, partial transfer) is retried with exponential backoff and full
// jitter, up to max_attempts. Other statuses come back to the caller (they decide what 404
// means). The result says how many retries were made, and the server's request id.
//
// Secrets: credentials live only in the Request's `userpwd` / headers the caller supplies and
// in libcurl's handle; nothing here prints them (no CURLOPT_VERBOSE, errors name the method,
// the URL without its query, the status and curl's message only).
//
// Cancellation: IoOptions is checked before each attempt and by a progress callback during
// transfers (stop token, deadline). A request in backoff sleeps in small steps and checks too.
//
// Thread-safety: execute() may be called from any number of threads at once; handles are
// pooled per client, so connections are reused.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/byte_io.h"
#include "storage/storage.h"

namespace shardpoint::storage::http {

struct RetryPolicy {
  // Attempts in all (1 = no retries). Raise it for flaky links; each retry waits longer.
  int max_attempts = 6;
  // The first backoff; each retry doubles it up to max_backoff. The wait is uniform in
  // [0, backoff] (full jitter), so ranks that failed together do not retry together.
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
  // Per-attempt limits. connect_timeout bounds a dead host; low_speed aborts a transfer that
  // moved less than low_speed_bytes per second for low_speed_time (a hung server).
  std::chrono::milliseconds connect_timeout{10000};
  long low_speed_bytes = 1024;
  std::chrono::seconds low_speed_time{30};
};

struct Request {
  std::string method = "GET";
  std::string url;                   // full, percent-encoded
  std::vector<std::string> headers;  // "Name: value"
  ByteSpan body;                     // sent as the request body (PUT/POST); caller-owned
  // Response body into this buffer instead of Response::body (ranged GET). More bytes than
  // fit is a transport error; fewer is reported by Response::bytes_received.
  std::span<std::byte> body_out;
  bool use_body_out = false;
  bool head = false;                 // no response body (HEAD)
  // "aws:amz:<region>:s3" to sign with SigV4 (then userpwd = "<access key>:<secret>").
  std::string aws_sigv4;
  std::string userpwd;  // secret; never printed
};

struct Response {
  long status = 0;
  std::string body;  // unless Request::use_body_out
  std::uint64_t bytes_received = 0;
  std::map<std::string, std::string> headers;  // names lowercased; last value wins
  int retries = 0;
  std::string request_id;  // x-amz-request-id / x-ms-request-id / x-guploader-uploadid

  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

class HttpClient {
 public:
  explicit HttpClient(RetryPolicy policy = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Performs the request, retrying as RetryPolicy says. Returns the last response (any
  // status). Throws StorageError kTransient ("<what>: <curl error> (N retries)") when every
  // attempt failed in transport or with a retryable status is returned as a Response.
  // `what` names the operation and object for messages ("PUT S3 object \"s3://b/k\"").
  Response execute(const Request& request, const IoOptions& io, const std::string& what);

  const RetryPolicy& policy() const { return policy_; }

 private:
  struct Handle;
  std::unique_ptr<Handle> take_handle();
  void give_back(std::unique_ptr<Handle> handle);

  RetryPolicy policy_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Handle>> idle_;  // GUARDED_BY(mu_)
};

// True for statuses the client retries (5xx, 429).
bool is_retryable_status(long status);

// Percent-encodes s as AWS SigV4 wants (RFC 3986 unreserved kept; '/' kept when keep_slash).
std::string uri_encode(std::string_view s, bool keep_slash);

// The URL without its query string, for messages (queries may carry upload ids, tokens).
std::string strip_query(std::string_view url);

}  // namespace shardpoint::storage::http
