// Where a checkpoint's metadata is: `.metadata`, or the per-rank files `__<rank>.metadata`
// that `dcp.save(..., use_collectives=False)` writes instead (docs/dcp-format.md §1.4).
//
// Per-rank checkpoints: each rank writes its own items to `__<rank>_<i>.distcp` and a
// `.metadata`-format pickle of only those items to `__<rank>.metadata`; nothing records the
// world size. Their union is the checkpoint: tensors agree on dtype, shape and properties,
// chunks are merged (a chunk several ranks saved, a replicated tensor, is read from the
// lowest rank's file), objects and planner_data entries come from the lowest rank that has
// them. The world size is 1 + the highest rank that any `__<rank>.metadata` or
// `__<rank>_<i>.distcp` names; a rank below it without its metadata file is an error, never
// a silent partial read (PyTorch's own readers read `__0.metadata` alone).
//
// Thread-safety: free functions; as safe as the storage.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shardpoint/metadata.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

// The checkpoint's metadata as `.metadata` bytes: the file itself when it exists, else the
// union of the per-rank files encoded as one (format/metadata_codec.h encode_metadata;
// storage_meta and version are not kept). nullopt when the folder has neither. Throws
// FormatError: a per-rank file missing ("<folder>/__1.metadata: missing: ..."), damaged, or
// disagreeing with another; StorageError on read failure.
std::optional<std::string> try_read_checkpoint_metadata(storage::Storage& st);

// As try_read_checkpoint_metadata, but a folder with neither is StorageError kNotFound
// "<.metadata>: not a committed checkpoint (no .metadata)".
std::string read_checkpoint_metadata(storage::Storage& st);

// True when the folder holds `.metadata` or any `__<rank>.metadata` (one or two stats, and
// a listing of "__" when both fail).
bool has_checkpoint_metadata(storage::Storage& st);

// The union of per-rank metadata (index = rank), as described above. `names` name the
// files in errors. Throws FormatError when two ranks disagree on a tensor or a chunk.
format::Metadata merge_rank_metadata(const std::vector<format::Metadata>& ranks, const std::vector<std::string>& names);

}  // namespace shardpoint::engine
