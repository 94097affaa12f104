#include "cli/output.h"

#include <cerrno>
#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.h"
#include "shardpoint/error.h"

namespace shardpoint::cli {

void print_out(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0) {
    if (errno == EPIPE) throw StdoutClosed();
    throw StorageError(StorageError::Kind::kOther, "writing to stdout failed");
  }
}

std::string human_bytes(std::uint64_t n) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return fmt::format("{} B", n);
  double v = static_cast<double>(n);
  int unit = 0;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", v, kUnits[unit]);
}

}  // namespace shardpoint::cli
