// Load planning with resharding: which pieces of which saved chunks fill the boxes a rank
// asks for, and the exact byte runs to read for each piece (docs/dcp-format.md §4.1,
// §4.4).
//
// For every requested tensor box L and every saved chunk S of that fqn that overlaps it,
// a ReadItem copies the intersection: per dimension d,
//   length = min(S.off+S.size, L.off+L.size) - max(S.off, L.off)
//   S.off > L.off ? (storage_offset 0, dest_offset S.off-L.off)
//                 : (storage_offset L.off-S.off, dest_offset 0).
// A requested object reads its bytes item whole. Any world size and any sharding can load
// any checkpoint this way; each rank reads only what its own boxes need.
//
// Pure functions of values, deterministic (items sorted by fqn, then saved chunk offsets);
// thread-compatible. No I/O: the executor turns ReadItems into preads with
// saved_chunk_byte_ranges / dest_byte_ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/flatten.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/metadata.h"

namespace shardpoint::engine {

enum class ReadItemType { kTensor, kBytes };

struct ReadItem {
  ReadItemType type = ReadItemType::kTensor;
  // The requested leaf: fqn and, for tensors, the offsets of the rank's box (global).
  format::MetadataIndex dest_index;
  // Offsets inside the rank's box (not global). Empty for bytes items.
  Shape dest_offsets;
  // The saved chunk: fqn, its global offsets (the storage_data key) and its position in
  // TensorStorageMetadata::chunks in index.index. A bytes item: fqn only.
  format::MetadataIndex storage_index;
  // Offsets inside the saved chunk (not global). Empty for bytes items.
  Shape storage_offsets;
  // Extent of the copied box, per dimension (empty for a 0-dim tensor or a bytes item).
  Shape lengths;

  // All fields, including the chunk positions in the indexes.
  bool operator==(const ReadItem& other) const;
  // e.g. "w" [2:4, 0:3] <- chunk #1 at [2, 0] [0:2, 0:3]  (dest box-local <- chunk-local)
  std::string to_string() const;
};

struct LoadPlanOptions {
  // true: make_load_plan throws one PlanError listing every problem (unexpected keys
  // only when unexpected_keys_are_errors). false: the problems are returned in
  // LoadPlan::problems and the affected fqns get no ReadItems (DCP's allow_partial_load,
  // extended to mismatches).
  bool strict = true;
  // DCP ignores checkpoint keys nobody asked for; set to reject them.
  bool unexpected_keys_are_errors = false;
};

struct LoadPlan {
  std::vector<ReadItem> items;
  // Every problem found, sorted by fqn then kind (unexpected keys included, also in
  // strict mode when they are not errors).
  std::vector<LoadProblem> problems;

  bool operator==(const LoadPlan&) const = default;
  std::string to_string() const;
};

// REQUIRES every requested tensor box lies inside its own global shape (UsageError
// naming the fqn otherwise). Throws PlanError in strict mode as described on
// LoadPlanOptions; the message names each fqn with expected vs found.
// Zero-volume intersections and empty saved chunks produce no ReadItem.
LoadPlan make_load_plan(const format::Metadata& metadata, const FlatStateDict& requested,
                        const LoadPlanOptions& options = {});

// Flattens `root` the way DCP >= 2.5 does for a load: with the 2.4 rule, unless the
// checkpoint holds keys that are not requested and the 2.3 rule produces some of them
// (then the checkpoint is 2.3-era and the 2.3 rule is used).
FlatStateDict flatten_for_load(const format::Metadata& metadata, const StateNode& root);

// [offset, offset + length) in bytes.
struct ByteRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  bool operator==(const ByteRange&) const = default;
};

// The bytes of the saved chunk that `item` needs, as row-major byte runs relative to the
// start of the chunk's data, ascending and merged where contiguous: a read covering the
// full trailing dimensions is one run; a dim-1 slice is one run per row.
// REQUIRES the saved data is row-major contiguous with sizes `saved_chunk_sizes`
// (what shardpoint writes and DCP normally writes; docs/dcp-format.md §2.3), and the item fits in it
// (UsageError otherwise). Empty for a zero-volume item. A bytes item: empty.
std::vector<ByteRange> saved_chunk_byte_ranges(const ReadItem& item, const Shape& saved_chunk_sizes,
                                               std::size_t itemsize);

// The same for the destination: the runs of the rank's row-major box (sizes
// `dest_box_sizes`) that `item` fills. Both lists enumerate the item's elements in the same
// row-major order, so the concatenated saved runs are exactly the concatenated
// destination runs: pread the saved runs into a buffer, then scatter it over these.
std::vector<ByteRange> dest_byte_ranges(const ReadItem& item, const Shape& dest_box_sizes, std::size_t itemsize);

}  // namespace shardpoint::engine
