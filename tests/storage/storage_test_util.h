// Helpers the storage tests share: test data and whole-object reads and copies through the
// Storage interface (any driver).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/byte_io.h"
#include "shardpoint/storage.h"

namespace shardpoint::storage::testing {

// Deterministic, position-dependent bytes: a misplaced range never compares equal, and
// different seeds give different data.
inline std::string pattern(std::size_t n, std::uint32_t seed) {
  std::string s(n, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (char& c : s) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

// `n` bytes of `key` from `offset`.
inline std::string read_range(Storage& st, std::string_view key, std::uint64_t offset, std::size_t n) {
  std::string out(n, '\0');
  st.read(key, offset, std::as_writable_bytes(std::span(out)));
  return out;
}

// The whole object `key`.
inline std::string read_all(Storage& st, std::string_view key) { return read_range(st, key, 0, st.stat(key)); }

// Every object of `from` written under the same key in `to`.
inline void copy_objects(Storage& from, Storage& to) {
  for (const ObjectInfo& o : from.list("")) to.write_atomic(o.key, as_bytes(read_all(from, o.key)));
}

}  // namespace shardpoint::storage::testing
