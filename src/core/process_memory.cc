#include "core/process_memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shardpoint {
namespace {

// A field of /proc/self/status in bytes ("VmRSS:", "VmHWM:"), 0 when unavailable.
std::uint64_t proc_status_bytes(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "re");
  if (f == nullptr) return 0;
  char line[256];
  std::uint64_t kib = 0;
  const std::size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, field, n) == 0) {
      kib = std::strtoull(line + n, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

}  // namespace

std::uint64_t process_rss_bytes() { return proc_status_bytes("VmRSS:"); }

std::uint64_t process_peak_rss_bytes() { return proc_status_bytes("VmHWM:"); }

}  // namespace shardpoint
