#include "cli/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace shardpoint::cli {

std::string format_bytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%.0f %s", bytes, kUnits[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", bytes, kUnits[u]);
  }
  return buf;
}

std::string progress_line(std::uint64_t done, std::uint64_t total, double seconds, int width) {
  double frac = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  if (frac > 1) frac = 1;
  int fill = static_cast<int>(frac * width);
  std::string bar = "[";
  for (int i = 0; i < width; ++i) bar += i < fill ? '=' : (i == fill ? '>' : ' ');
  bar += "]";
  double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  char tail[96];
  if (rate > 0 && done < total) {
    const long eta = std::lround(static_cast<double>(total - done) / rate);
    std::snprintf(tail, sizeof tail, "  %.2f GB/s  ETA %ld:%02ld", rate / 1e9, eta / 60, eta % 60);
  } else {
    std::snprintf(tail, sizeof tail, "  %.2f GB/s", rate / 1e9);
  }
  return bar + " " + format_bytes(static_cast<double>(done)) + " / " + format_bytes(static_cast<double>(total)) + tail;
}

ProgressBar::ProgressBar(bool enabled)
    : active_(enabled && ::isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()), last_() {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(std::uint64_t done, std::uint64_t total) {
  if (!active_) return;
  auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  std::string line = progress_line(done, total, std::chrono::duration<double>(now - start_).count());
  std::fprintf(stderr, "\r%s\x1b[K", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (active_ && drawn_) {
    std::fprintf(stderr, "\r\x1b[K");
    std::fflush(stderr);
  }
  drawn_ = false;
}

}  // namespace shardpoint::cli
