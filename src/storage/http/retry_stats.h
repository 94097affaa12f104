// Retry statistics of the HTTP client: why requests were retried, counted per cause for the
// whole process (every HttpClient adds to the same counters), so a command can report them
// (`shardpoint --verbose`) and tests can check that a fault was met by a retry.
//
// Thread-safety: every function may be called from any thread at once (relaxed atomics: a
// snapshot taken while requests run may mix counts from before and after one retry).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace shardpoint::storage::http {

// Why an attempt was retried. Each failed attempt that is followed by another counts once.
enum class RetryCause : std::uint8_t {
  kThrottled,     // HTTP 429 or 503 (S3 SlowDown, Azure ServerBusy, GCS rateLimitExceeded)
  kServerError,   // another HTTP 5xx
  kTimeout,       // HTTP 408, or a transfer too slow (RetryPolicy::low_speed_*) or past connect_timeout
  kConnection,    // connection refused, reset or closed with no answer
  kTruncated,     // the connection closed before Content-Length bytes of body arrived
  kMalformed,     // not an HTTP answer (garbage status line, HTTP/0.9: junk left on a connection)
  kBadRange,      // a ranged GET answered with another range or another body length
  kBodyChecksum,  // the server refused a body that does not match its checksum (damaged on the way)
};
inline constexpr std::size_t kRetryCauses = 8;

// "throttled", "server error", "timeout", "connection", "truncated body", "malformed
// response", "wrong range", "body checksum mismatch".
std::string_view retry_cause_name(RetryCause cause);

struct RetryCounts {
  std::array<std::uint64_t, kRetryCauses> retries{};  // indexed by RetryCause
  std::uint64_t exhausted = 0;                        // requests that failed after their last attempt

  std::uint64_t total() const;
  std::uint64_t operator[](RetryCause cause) const { return retries[static_cast<std::size_t>(cause)]; }
};

// Adds one retry of `cause` / one request that ran out of attempts.
void count_retry(RetryCause cause);
void count_exhausted();

// The counts since the process started.
RetryCounts retry_counts();

// The counts added between `before` and `after`.
RetryCounts retry_counts_since(const RetryCounts& before, const RetryCounts& after);

// One line for --verbose: "http: 5 retries (2 throttled, 3 malformed response), 0 requests
// out of retries".
std::string describe_retry_counts(const RetryCounts& counts);

}  // namespace shardpoint::storage::http
