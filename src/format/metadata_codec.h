// The `.metadata` codec: DCP's pickled Metadata <-> format::Metadata (metadata.h).
//
// Layout: a Python pickle (protocol 2-5) of torch.distributed.checkpoint.metadata.Metadata;
// classes, fields and the history of their module paths are in
// docs/dcp-format.md §3 (§3.2 paths, §3.3 fields, §3.4 torch values).
//
// decode_metadata reads every form PyTorch 1.13 ... newest writes. Classes are recognised
// by name, not module, because the modules moved between releases (1.13
// `torch.distributed._shard.checkpoint`, 2.0+ `torch.distributed.checkpoint`, TensorProperties
// in `_shard.sharded_tensor.metadata` until 2.2 and in `checkpoint.metadata` from 2.3).
// Nothing in the pickle is executed.
//
// encode_metadata writes the §3.7 recipe: the form that PyTorch 2.0 ... newest all load
// (protocol 2, `_shard` TensorProperties with REDUCE(MEM_FORMAT_ENCODING, (n,)), no
// StorageMeta, no version, planner_data always a dict of tuples). Output is deterministic:
// equal Metadata gives equal bytes.
//
// Thread-safety: all functions are reentrant.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/byte_io.h"
#include "shardpoint/metadata.h"

namespace shardpoint::format {

// Parses a `.metadata` pickle. `source_name` (e.g. "ckpt/.metadata") starts every error
// message.
//
// Checked (FormatError naming source_name, the field path / fqn, expected vs found):
// the class of every object, the kinds of every field, dtype names, the layout (strided
// only), chunk offsets/sizes non-negative and of the tensor's rank, storage offsets and
// lengths non-negative. Not checked: that chunks tile the tensor (check_chunk_tiling), that
// every chunk has a storage_data entry. Tolerated: missing optional fields (planner_data,
// storage_data, storage_meta, version, index, transform_descriptors, modules), unknown
// extra keys (ignored), BytesStorageMetadata with or without BUILD.
//
// planner_data: entries whose value is a tuple/list of str/int go to Metadata::planner_data;
// the whole value as read is kept in planner_data_raw (null when None or absent).
// StorageMeta::checkpoint_id: str, None or a pathlib path (joined to a string); any other
// object is kept as its Python repr.
// Throws FormatError (also for malformed pickles, from the pickle reader).
Metadata decode_metadata(ByteSpan bytes, std::string_view source_name);

// Writes `metadata` as a `.metadata` pickle (§3.7), state_dict_metadata in key_order's
// order when set, then the other keys sorted. Dropped: storage_meta, version,
// planner_data_raw. planner_data gets (fqn,) for every fqn of state_dict_metadata that has
// no entry. MetadataIndex.index: the stored value, else the chunk's position in its
// tensor's chunk list when the offset matches one, else None.
// Throws UsageError for what decode_metadata would refuse: negative sizes/offsets, chunk
// ranks different from the tensor's, memory_format outside 0..2, storage offsets or
// lengths beyond 2^63-1. Any other Metadata encodes, and decodes back equal
// (same_encoded_content).
std::string encode_metadata(const Metadata& metadata);

// Problems with how `tensor.chunks` cover [0, tensor.size): chunks of the wrong rank or
// with negative values, chunks outside the tensor, overlapping chunk pairs, and uncovered
// elements (reported as a count: "chunks cover N of M elements"). Empty when the chunks
// tile the tensor exactly. Volume arithmetic is exact; a volume that does not fit in
// 64 bits is reported as a problem rather than wrapped.
// Each entry is one sentence, e.g. "chunk 1 [0:4, 2:6] overlaps chunk 0 [0:4, 0:4]".
std::vector<std::string> check_chunk_tiling(const TensorStorageMetadata& tensor);

// Every consistency problem of a decoded Metadata, one sentence each, for `verify`:
// check_chunk_tiling() of every tensor (prefixed with the fqn); chunks and bytes items
// without a storage_data entry; storage_data entries that name no item or no chunk; item
// relative paths that are not plain relative paths (is_safe_relative_path); items whose
// byte ranges overlap within one file. Empty when consistent. Pure; no I/O.
std::vector<std::string> check_metadata(const Metadata& md);

// True when a and b hold the same content as far as encode_metadata writes it:
// state_dict_metadata, storage_data (keys compared by fqn and offset, as MetadataIndex
// does) and planner_data after the (fqn,) fill-in encode_metadata applies.
bool same_encoded_content(const Metadata& a, const Metadata& b);

// "[0:4, 2:6]": a chunk as a box of half-open ranges, for messages.
std::string describe_chunk(const ChunkStorageMetadata& chunk);

}  // namespace shardpoint::format
