#include "storage/http/retry_stats.h"

#include <atomic>

namespace shardpoint::storage::http {
namespace {

std::array<std::atomic<std::uint64_t>, kRetryCauses> g_retries{};
std::atomic<std::uint64_t> g_exhausted{0};

}  // namespace

std::string_view retry_cause_name(RetryCause cause) {
  switch (cause) {
    case RetryCause::kThrottled: return "throttled";
    case RetryCause::kServerError: return "server error";
    case RetryCause::kTimeout: return "timeout";
    case RetryCause::kConnection: return "connection";
    case RetryCause::kTruncated: return "truncated body";
    case RetryCause::kMalformed: return "malformed response";
    case RetryCause::kBadRange: return "wrong range";
    case RetryCause::kBodyChecksum: return "body checksum mismatch";
  }
  return "unknown";
}

std::uint64_t RetryCounts::total() const {
  std::uint64_t n = 0;
  for (std::uint64_t r : retries) n += r;
  return n;
}

void count_retry(RetryCause cause) {
  g_retries[static_cast<std::size_t>(cause)].fetch_add(1, std::memory_order_relaxed);
}

void count_exhausted() { g_exhausted.fetch_add(1, std::memory_order_relaxed); }

RetryCounts retry_counts() {
  RetryCounts c;
  for (std::size_t i = 0; i < kRetryCauses; ++i) c.retries[i] = g_retries[i].load(std::memory_order_relaxed);
  c.exhausted = g_exhausted.load(std::memory_order_relaxed);
  return c;
}

RetryCounts retry_counts_since(const RetryCounts& before, const RetryCounts& after) {
  RetryCounts d;
  for (std::size_t i = 0; i < kRetryCauses; ++i) d.retries[i] = after.retries[i] - before.retries[i];
  d.exhausted = after.exhausted - before.exhausted;
  return d;
}

std::string describe_retry_counts(const RetryCounts& counts) {
  const std::uint64_t total = counts.total();
  std::string out = "http: " + std::to_string(total) + (total == 1 ? " retry" : " retries");
  std::string parts;
  for (std::size_t i = 0; i < kRetryCauses; ++i) {
    if (counts.retries[i] == 0) continue;
    if (!parts.empty()) parts += ", ";
    parts += std::to_string(counts.retries[i]) + " " + std::string(retry_cause_name(static_cast<RetryCause>(i)));
  }
  if (!parts.empty()) out += " (" + parts + ")";
  out +=
      ", " + std::to_string(counts.exhausted) + (counts.exhausted == 1 ? " request" : " requests") + " out of retries";
  return out;
}

}  // namespace shardpoint::storage::http
