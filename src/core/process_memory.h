// The calling process's memory as Linux reports it in /proc/self/status, for memory
// budgets that count what the process already holds.
//
// Thread-safety: reads a file; safe from any thread.
#pragma once

#include <cstdint>

namespace shardpoint {

// VmRSS in bytes: resident memory now. 0 when unavailable (not Linux, no /proc).
std::uint64_t process_rss_bytes();

// VmHWM in bytes: the peak resident memory so far. 0 when unavailable.
std::uint64_t process_peak_rss_bytes();

}  // namespace shardpoint
