#include "core/kill_point.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace shardpoint {
namespace {

constexpr std::array<KillPoint, 8> kAll = {KillPoint::kPlan,      KillPoint::kDataWrite, KillPoint::kSidecar,
                                           KillPoint::kLoadIndex, KillPoint::kMetadata,  KillPoint::kMetaPt,
                                           KillPoint::kPublish,   KillPoint::kRemoveOld};

// What SHARDPOINT_TEST_KILL_AT (or SHARDPOINT_TEST_READ_ONLY_AT) asks for, parsed once.
struct KillRequest {
  KillPoint point = KillPoint::kPlan;
  long occurrence = 1;
};

std::optional<long> parse_count(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 9) return std::nullopt;
  return std::stol(text);
}

// nullopt when the variable `name` is unset, malformed (warned) or names another rank.
std::optional<KillRequest> parse_request(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  std::string spec(value);
  KillRequest request;
  if (const std::size_t at = spec.find('@'); at != std::string::npos) {
    const std::optional<long> n = parse_count(spec.substr(at + 1));
    if (!n || *n < 1) {
      std::fprintf(stderr, "warning: %s=%s: bad occurrence after '@', ignored\n", name, value);
      return std::nullopt;
    }
    request.occurrence = *n;
    spec.resize(at);
  }
  if (const std::size_t colon = spec.find(':'); colon != std::string::npos) {
    const std::optional<long> rank = parse_count(spec.substr(colon + 1));
    if (!rank) {
      std::fprintf(stderr, "warning: %s=%s: bad rank after ':', ignored\n", name, value);
      return std::nullopt;
    }
    const char* mine = std::getenv("RANK");
    if (*rank != (mine != nullptr ? std::atol(mine) : 0)) return std::nullopt;
    spec.resize(colon);
  }
  for (KillPoint p : kAll) {
    if (spec == kill_point_name(p)) {
      request.point = p;
      return request;
    }
  }
  std::fprintf(stderr, "warning: %s=%s: unknown kill point, ignored\n", name, value);
  return std::nullopt;
}

}  // namespace

std::string_view kill_point_name(KillPoint point) {
  switch (point) {
    case KillPoint::kPlan: return "plan";
    case KillPoint::kDataWrite: return "data";
    case KillPoint::kSidecar: return "sidecar";
    case KillPoint::kLoadIndex: return "index";
    case KillPoint::kMetadata: return "metadata";
    case KillPoint::kMetaPt: return "meta_pt";
    case KillPoint::kPublish: return "publish";
    case KillPoint::kRemoveOld: return "remove_old";
  }
  return "?";
}

namespace {

// True at the arrival `request` selects; counts the arrivals at its point.
bool selected(const std::optional<KillRequest>& request, std::atomic<long>& reached, KillPoint point) {
  if (!request || request->point != point) return false;
  return reached.fetch_add(1, std::memory_order_relaxed) + 1 == request->occurrence;
}

// Removes the write permission of SHARDPOINT_TEST_READ_ONLY_PATH (user, group and other),
// as an administrator or a quota tool would while the save runs.
void revoke_write_permission() {
  const char* path = std::getenv("SHARDPOINT_TEST_READ_ONLY_PATH");
  struct stat st {};
  if (path == nullptr || ::stat(path, &st) != 0 || ::chmod(path, st.st_mode & 07555) != 0) {
    std::fprintf(stderr,
                 "warning: SHARDPOINT_TEST_READ_ONLY_AT: cannot make SHARDPOINT_TEST_READ_ONLY_PATH=%s read-only\n",
                 path != nullptr ? path : "(unset)");
  }
}

}  // namespace

void kill_point(KillPoint point) noexcept {
  // Thread-safe initialisation, once per process.
  static const std::optional<KillRequest> kill = parse_request("SHARDPOINT_TEST_KILL_AT");
  static const std::optional<KillRequest> read_only = parse_request("SHARDPOINT_TEST_READ_ONLY_AT");
  static std::atomic<long> kill_reached{0};
  static std::atomic<long> read_only_reached{0};
  if (selected(read_only, read_only_reached, point)) revoke_write_permission();
  if (!selected(kill, kill_reached, point)) return;
  std::fflush(nullptr);  // what was printed so far reaches the log, as it would before a real kill
  ::kill(0, SIGKILL);
  ::_exit(137);  // not reached: SIGKILL cannot be caught
}

}  // namespace shardpoint
