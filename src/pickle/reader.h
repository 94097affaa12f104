// Pickle reader: bytes -> value tree, for protocols 0-5 and every opcode CPython emits.
//
// Nothing is executed: globals stay kGlobal, calls stay kObject, persistent ids stay
// kPersistentId (see value.h). Memo sharing is kept as shared nodes; cycles are allowed
// (see value.h for the ownership of cyclic graphs).
//
// Hostile input: any malformed, truncated or lying input throws FormatError naming
// `source_name`, the byte offset of the opcode and what was expected. Never a crash, hang
// or unbounded allocation: every length is checked against the bytes that remain before
// anything is allocated, and nesting deeper than ReadOptions::max_depth is refused.
//
// Thread-safety: read_pickle is reentrant.
#pragma once

#include <cstddef>
#include <string_view>

#include "core/byte_io.h"
#include "pickle/value.h"

namespace shardpoint::pickle {

struct ReadOptions {
  // Deepest container nesting accepted. Consumers that recurse (writer, repr) rely on it.
  std::size_t max_depth = 2000;
  // Stop after the first STOP opcode; bytes after it are ignored (Python's pickle.loads
  // ignores them too). When false, trailing bytes are a FormatError.
  bool allow_trailing_bytes = true;
};

// Parses one pickle from data. `source_name` is used in error messages (a file name,
// "archive/data.pkl in model.pt", ...).
// Throws FormatError.
ValuePtr read_pickle(ByteSpan data, std::string_view source_name, const ReadOptions& options = {});

}  // namespace shardpoint::pickle
