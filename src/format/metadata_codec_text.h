// Text helpers shared by the `.metadata` decoder, encoder and checks (metadata_codec.h):
// how messages quote names and print shapes. Private to the format layer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "shardpoint/metadata.h"

namespace shardpoint::format::codec_text {

// s in double quotes, '"' and '\\' escaped: "fqn".
inline std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

// "[4, 8]".
inline std::string shape_text(const Shape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// True when any entry of s is negative.
inline bool has_negative(const Shape& s) {
  return std::any_of(s.begin(), s.end(), [](std::int64_t x) { return x < 0; });
}

}  // namespace shardpoint::format::codec_text
