// ProgressBar: one self-rewriting line on stderr for long copies: bar, bytes done/total,
// rate and ETA. Draws only when stderr is a terminal and the caller did not ask for quiet;
// otherwise every call is a no-op. Redraws at most 10 times a second.
//
// Thread-compatible: one thread calls update()/finish().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace shardpoint::cli {

class ProgressBar {
 public:
  // enabled = false: draws nothing. enabled = true: draws when stderr is a TTY.
  explicit ProgressBar(bool enabled);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool active() const { return active_; }
  void update(std::uint64_t done, std::uint64_t total);
  // Clears the line (no trace left on success).
  void finish();

 private:
  bool active_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
};

// "1.50 GiB", "512.0 KiB", "17 B".
std::string format_bytes(double bytes);
// The text of one bar line (for tests): "[=====>    ]  1.0/2.0 GiB  1.20 GB/s  ETA 0:03".
std::string progress_line(std::uint64_t done, std::uint64_t total, double seconds, int width = 30);

}  // namespace shardpoint::cli
