// env_int(): parses an integer environment variable, for the drivers that read torchrun's
// environment (tcp_communicator.cc, gloo_communicator.cc). Header-only: sp_comm_gloo and
// sp_comm share it without a new exported symbol.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "shardpoint/error.h"

namespace shardpoint::comm::detail {

// The value of `name`; nullopt when unset. Throws UsageError naming the variable when it is
// not an integer in [min, max].
inline std::optional<long> env_int(const char* name, long min, long max) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  const std::string_view s(v);
  long value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < min || value > max) {
    throw UsageError(fmt::format("environment variable {}=\"{}\": expected an integer in [{}, {}]", name, s, min, max));
  }
  return value;
}

}  // namespace shardpoint::comm::detail
