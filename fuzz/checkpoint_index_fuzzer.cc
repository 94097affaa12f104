// Fuzzes decode_checkpoint_index and index_matches. Invariants: any input either decodes
// or throws FormatError (never crashes, hangs or allocates beyond the input); a decoded
// index re-encodes to one that decodes to the same content and matches the `.metadata`
// bytes it was bound to.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/checkpoint_index.h"
#include "shardpoint/error.h"

using shardpoint::FormatError;
using shardpoint::engine::CheckpointIndex;

namespace {

bool same(const CheckpointIndex& a, const CheckpointIndex& b) {
  const auto& x = a.metadata;
  const auto& y = b.metadata;
  if (x.state_dict_metadata != y.state_dict_metadata || x.key_order != y.key_order ||
      x.planner_data != y.planner_data || x.storage_meta != y.storage_meta || x.version != y.version ||
      x.storage_data != y.storage_data || a.data_offsets != b.data_offsets) {
    return false;
  }
  if (a.checksums.has_value() != b.checksums.has_value()) return false;
  return !a.checksums ||
         (a.checksums->algorithm() == b.checksums->algorithm() &&
          a.checksums->block_size() == b.checksums->block_size() && a.checksums->items() == b.checksums->items());
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  (void)shardpoint::engine::index_matches(input, shardpoint::as_bytes(input));
  CheckpointIndex index;
  try {
    index = shardpoint::engine::decode_checkpoint_index(input, "fuzz/.shardpoint-index");
  } catch (const FormatError&) {
    return 0;
  }
  const std::string metadata_bytes = "stand-in .metadata";
  const std::string encoded =
      shardpoint::engine::encode_checkpoint_index(index.metadata, shardpoint::as_bytes(metadata_bytes),
                                                  index.checksums ? &*index.checksums : nullptr, index.data_offsets);
  if (!shardpoint::engine::index_matches(encoded, shardpoint::as_bytes(metadata_bytes))) {
    fail("a re-encoded index does not match the bytes it was bound to");
  }
  CheckpointIndex again;
  try {
    again = shardpoint::engine::decode_checkpoint_index(encoded, "re-encoded");
  } catch (const FormatError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fail("encode output does not decode");
  }
  if (!same(index, again)) fail("decode(encode(index)) differs from index");
  return 0;
}
