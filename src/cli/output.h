// Output helpers of the CLI: stdout that ends quietly on a closed pipe, human sizes.
#pragma once

#include <cstdint>
#include <string>

namespace shardpoint::cli {

// "1.5 KiB", "3.0 GiB", "17 B".
std::string human_bytes(std::uint64_t n);

}  // namespace shardpoint::cli
