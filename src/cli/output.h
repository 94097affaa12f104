// Output helpers of the CLI: stdout that ends quietly on a closed pipe, human sizes.
#pragma once

#include <cstdint>
#include <string>

namespace shardpoint::cli {

// "1.5 KiB", "3.0 GiB", "17 B".
std::string human_bytes(std::uint64_t n);

// "256MiB", "16M", "5GB", "1000" -> bytes. Binary for K/M/G/T, KiB/MiB/GiB/TiB; decimal for
// KB/MB/GB/TB. Throws UsageError. (Defined in consolidate_command.cc.)
std::uint64_t parse_size(const std::string& text);

}  // namespace shardpoint::cli
