// Helpers shared by the pickle tests.
#pragma once

#include <string>
#include <string_view>

#include "pickle/reader.h"
#include "pickle/writer.h"
#include "shardpoint/pickle_value.h"

namespace shardpoint::pickle::testing {

// A std::string from a literal that may contain NUL bytes.
template <std::size_t N>
std::string bytes_of(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

inline ValuePtr read(std::string_view data, const ReadOptions& options = {}) {
  return read_pickle(as_bytes(data), "test.pkl", options);
}

inline std::string write(const Value& v, int protocol) {
  WriteOptions options;
  options.protocol = protocol;
  return pickle_to_string(v, options);
}

}  // namespace shardpoint::pickle::testing
