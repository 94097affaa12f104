// Checkpoints whose tensors are stored as safetensors, described in DCP's Metadata model so
// that every reader (load, CheckpointReader, PlannedReader) plans on them as on any DCP
// folder (docs/dcp-format.md §9):
//
//  - A Hugging Face folder (HuggingFaceStorageWriter): `model-0000i-of-0000N.safetensors`
//    + `model.safetensors.index.json` after consolidation, or the per-rank
//    `shard-0000r-model-0000i-of-0000N.safetensors` of its `sharded/` folder, whose
//    `__metadata__` DCP_SHARDING_INFO says where each tensor sits in the full tensor.
//  - A DCP folder written with SerializationFormat.SAFETENSORS: `.metadata` as usual, but
//    the tensor items of a rank file are one safetensors blob, and each tensor item's
//    storage_data gives the blob's start with the tensor's byte count as length.
//
// Either way the result names, for every tensor chunk, the raw bytes of the chunk
// (row-major, little-endian, `length` = its byte count) inside its file: a "raw" tensor item,
// which readers read at blob offset 0 without parsing (SavedTensorBlob's data_offset).
// A torch.save zip blob is never that short (its records come on top of the data), so a
// tensor item whose length equals its byte count can only be a safetensors item.
//
// Thread-safety: functions with no shared state; they read through `folder`.
#pragma once

#include <string>

#include "shardpoint/metadata.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

// The index file HuggingFaceStorageWriter and transformers write beside the shards.
inline constexpr const char* kHfIndexKey = "model.safetensors.index.json";

// True when `key` is a file of a Hugging Face folder: "*.safetensors" directly in it
// (not in a subfolder such as `sharded/`, as PyTorch's reader lists them).
bool is_hf_tensor_file(std::string_view key);

// The Metadata of the Hugging Face folder `folder`: every top-level *.safetensors file's
// header read (8 bytes + the header each), a tensor's chunks at their DCP_SHARDING_INFO
// offsets (all zeros without it), the global size the largest extent of its chunks (as
// HuggingFaceStorageReader infers it), raw tensor items; the index JSON, when present,
// must name a file holding each tensor it lists. Throws StorageError kNotFound when the
// folder holds no *.safetensors file; FormatError naming the file and tensor for a bad
// header, index JSON, a tensor whose chunks disagree on dtype or rank, or a chunk two files
// hold.
format::Metadata read_hf_metadata(storage::Storage& folder);

// When `metadata` (a decoded `.metadata` of `folder`) has safetensors tensor items (above),
// rewrites each one's storage_data to its raw bytes, reading the header of each blob once;
// returns true. Returns false and reads nothing for any other checkpoint (zip items: the
// first tensor item decides). Throws FormatError when tensor items after a safetensors one
// are not, an item has
// stream transforms, or a blob's header is bad or lacks the item; StorageError on I/O.
bool resolve_safetensors_items(format::Metadata& metadata, storage::Storage& folder);

}  // namespace shardpoint::engine
