// HttpClient: the one HTTP layer of the object-store drivers (S3, GCS XML and JSON, Azure):
// blocking requests over libcurl, pooled connections, and the retry policy in one place.
//
// A request names a method, a full URL (already percent-encoded by the caller: signatures
// cover the bytes sent), headers, an optional body (a span the caller keeps alive for the
// call) and where the response body goes (a string, or a caller buffer for ranged GETs that
// land in place; error bodies always go to the string, capped at 64 MiB).
//
// Signing is per request, three ways: `aws_sigv4` hands SigV4 to libcurl (CURLOPT_AWS_SIGV4
// with CURLOPT_USERPWD: S3, GCS XML); fixed headers (GCS JSON's bearer token); or the `sign`
// hook, called before every attempt, for schemes that sign a timestamp (Azure SharedKey).
//
// Retries (RetryPolicy): a response 5xx, 408 or 429, a transport failure (refused or reset
// connection, timeout, truncated body, nothing received), a malformed answer (a garbage
// status line, junk a server left on a kept-alive connection), a ranged GET answered with
// another range or body length (Request::expect_range) or a body refused for not matching
// the checksum the request carries (Request::body_mismatch) is retried with exponential
// backoff and jitter, up to max_attempts. Other statuses come back to the caller (they decide what
// 404 means); so does the last retryable status when attempts run out, with
// Response::retries saying how many were made. Each retry is counted by cause
// (retry_stats.h).
//
// Connections: a handle whose attempt failed in transport or gave a bad answer is dropped
// with its connection, and the next attempt runs on a new handle, so a new connection: what
// a broken answer left unread cannot poison the pool or the retry.
//
// Secrets: credentials live only in the Request's `userpwd` / headers / hook and in libcurl's
// handle; nothing here prints them (no CURLOPT_VERBOSE; errors name the caller's `what`,
// curl's message and the retry count, never the URL's query or a header).
//
// Cancellation: IoOptions is checked before each attempt and by a progress callback during
// transfers (stop token, deadline). A request in backoff sleeps in small steps and checks too.
//
// Thread-safety: execute() may be called from any number of threads at once; handles (and
// their keep-alive connections) are pooled per client.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/byte_io.h"
#include "shardpoint/mutex.h"
#include "shardpoint/storage.h"

namespace shardpoint::storage::http {

struct RetryPolicy {
  // Attempts in all (1 = no retries). Raise it for flaky links; each retry waits longer.
  int max_attempts = 6;
  // Retry n waits a random time in [jitter_floor * cap, cap] with
  // cap = min(max_backoff, initial_backoff * 2^(n-1)). jitter_floor 0 is full jitter, so
  // ranks that failed together do not retry together.
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
  double jitter_floor = 0.0;
  // Per-attempt limits. connect_timeout bounds a dead host; low_speed aborts a transfer that
  // moved less than low_speed_bytes per second for low_speed_time (a hung server).
  std::chrono::milliseconds connect_timeout{10000};
  long low_speed_bytes = 1024;
  std::chrono::seconds low_speed_time{30};
};

// The bytes [offset, offset + length) of an object, as a ranged GET asks for them.
struct ByteRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

struct Response;

struct Request {
  std::string method = "GET";
  std::string url;                   // full, percent-encoded
  std::vector<std::string> headers;  // "Name: value"
  ByteSpan body;                     // sent as the request body (PUT/POST); caller-owned
  // Instead of `body` (which must then be empty): a body of several spans sent one after
  // another, e.g. a part whose tensor bytes go out from the caller's own memory with the
  // writer's copies between them (http/upload_writer.h). Caller-owned, the array and the
  // bytes, for the call. No gathering copy: libcurl reads each span in turn.
  std::span<const ByteSpan> body_pieces;
  // A 2xx response body goes into this buffer instead of Response::body (ranged GET). More
  // bytes than fit is an error; fewer is reported by Response::bytes_received.
  std::span<std::byte> body_out;
  bool use_body_out = false;
  // Set on a ranged GET (length > 0): a 206 must answer exactly this range, or its part up to
  // the end of a shorter object (check_range_answer). Any other 206 is a bad answer: retried
  // on a new connection, never returned as data.
  std::optional<ByteRange> expect_range;
  bool head = false;  // no response body (HEAD)
  // "aws:amz:<region>:s3" to sign with SigV4 (then userpwd = "<access key>:<secret>").
  std::string aws_sigv4;
  std::string userpwd;  // secret; never printed
  // Called before each attempt with a copy of `headers`, to add the headers of this attempt
  // (a date and a signature over it). Optional.
  std::function<void(std::vector<std::string>& headers)> sign;
  // For a request that carries a checksum of its body (Content-MD5, X-Goog-Hash): says
  // whether an answer is the service refusing a body that does not match it (body_checksum.h).
  // Such an answer is retried, the body sent again (RetryCause::kBodyChecksum): it was
  // damaged on the way. Optional; called only for 4xx answers.
  std::function<bool(const Response& response)> body_mismatch;
};

// The bytes of request's body: body_pieces' sizes added up, else body's size.
std::uint64_t body_size(const Request& request);

struct Response {
  long status = 0;
  std::string body;  // unless the 2xx body went to Request::body_out
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
  // status). Throws StorageError kTransient ("<what>: <cause>: <detail> (N retries)") when
  // the last attempt failed in transport or gave a bad answer, kOther for a transport error
  // not worth retrying (a bad URL, a TLS certificate problem) or an error body over 64 MiB,
  // and what check_io throws when cancelled or past the deadline. `what` names the operation
  // and object for messages ("PUT S3 object \"s3://b/k\"").
  Response execute(const Request& request, const IoOptions& io, const std::string& what);

  const RetryPolicy& policy() const { return policy_; }

 private:
  struct Handle;
  std::unique_ptr<Handle> take_handle();
  void give_back(std::unique_ptr<Handle> handle);

  RetryPolicy policy_;
  Mutex mu_;
  std::vector<std::unique_ptr<Handle>> idle_ SP_GUARDED_BY(mu_);
};

// True for statuses the client retries (5xx, 408, 429).
bool is_retryable_status(long status);

// Checks a 206 answer to a GET of `asked`: its Content-Range must be "bytes F-L/T" with F the
// asked offset and L the asked end, or L = T - 1 before it (a shorter object), and the body
// exactly L - F + 1 bytes; or, when T <= the asked offset, an empty body. Returns "" when it is, else what differs
// ("206 for bytes 11-110 of 1000 (100 body bytes), asked for bytes 10-109").
std::string check_range_answer(const ByteRange& asked, std::string_view content_range, std::uint64_t body_bytes);

// T of a Content-Range "bytes F-L/T" or "bytes */T": the whole object's size; nullopt when
// absent, "*" or malformed.
std::optional<std::uint64_t> content_range_total(std::string_view content_range);

// The whole object's size from a 200 (its body) or 206 (its Content-Range) answer to a ranged
// GET; nullopt when the 206 does not say ("bytes 0-9/*").
std::optional<std::uint64_t> object_size_of(const Response& ranged_get);

// Percent-encodes s (RFC 3986 unreserved characters kept; '/' kept when keep_slash), as
// SigV4, SharedKey and GCS object names want.
std::string uri_encode(std::string_view s, bool keep_slash);

// The URL without its query string, for messages (queries may carry upload ids, tokens).
std::string strip_query(std::string_view url);

// Decodes XML character data: the five predefined entities and numeric references (as
// UTF-8); anything else is kept as written. For S3 and Azure listings.
std::string xml_unescape(std::string_view s);

// The raw contents of every <tag>...</tag> in xml, in order. S3's and Azure's responses are
// flat enough to read by tag (a tag never nests inside itself).
std::vector<std::string_view> xml_blocks(std::string_view xml, std::string_view tag);

// The decoded text of the first <tag>...</tag> in xml; "" when there is none.
std::string xml_value(std::string_view xml, std::string_view tag);

// The StorageError kind of an HTTP error status, the same for every service: 404
// kNotFound, 401/403 kPermission, retryable statuses (above) kTransient, others kOther.
StorageError::Kind error_kind(long status);

// "1 retry", "3 retries": how error messages count a request's retries.
std::string retries_text(int retries);

}  // namespace shardpoint::storage::http
