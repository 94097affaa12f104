// The load index `.shardpoint-index` (kIndexKey, checkpoint.h): what a load needs to know about a
// checkpoint shardpoint wrote, in a form every rank decodes in milliseconds. PyTorch
// ignores the file; `.metadata` stays the checkpoint's truth.
//
// Why: every rank of a load needs the whole `.metadata` (a pickle of a node per chunk and
// field), the checksum sidecar (JSON) and, per blob it reads, the blob's zip records and
// data.pkl to find where the tensor bytes start. Decoding those was a fifth of a warm 4 -> 2
// load of a 2 GB state (its `.metadata`: 0.9 MB, ~60 ms per rank; the JSON sidecar ~14 ms;
// ~10-25 us per blob's headers). The index holds the same facts as binary.
//
// It binds to one `.metadata`: it records that file's length and CRC-32C, and a load uses
// the index only when the `.metadata` it read has both (else it reads `.metadata` and the
// sidecar as PyTorch's checkpoints are read). So an index left by an older save, or next
// to a `.metadata` another tool rewrote, is ignored, never trusted. A damaged index (its
// own CRC-32C, at the end, does not match) is ignored the same way, which is why the save
// writes it without an fsync of its own (a crash can only cost a load its speed-up).
//
// Persisted layout (little-endian; str = u32 length + UTF-8 bytes; shape = u32 rank + i64
// each; opt<X> = u8 0/1 + X when 1):
//   "SPINDEX\0"  u32 version (2; version 1 lacks the strides field and still decodes)
//   u64 length of `.metadata`, u32 its CRC-32C
//   u8 checksum algorithm (0 none, 1 crc32c, 2 xxh3), u64 block size (0 when none)
//   u32 tensors and objects, in key order; each: str fqn, u8 kind (0 tensor, 1 object);
//     a tensor: str dtype name, u8 requires_grad, u8 pin_memory, i32 memory_format,
//     opt<shape> strides (version 2 only), shape size, u32 chunks, each: shape offsets,
//     shape sizes
//   u32 planner_data entries; each: str fqn, u32 elements, each: u8 0 + str | u8 1 + i64
//   u32 storage items (sorted as Metadata::storage_data); each: str fqn, opt<shape>
//     chunk offset, opt<i64> chunk position, str relative_path, u64 offset, u64 length,
//     u32 transform descriptors, each str; opt<u64> tensor data start inside the blob;
//     opt<(u64 checksum, u32 blocks, u64 each)>
//   opt<(opt<str> checkpoint_id, opt<str> save_id, opt<str> load_id, u32 modules, str each)>
//   opt<str> version
//   u32 CRC-32C of every byte before it
// Written for the metadata shardpoint plans itself (save, async save, reshard), which never
// holds a raw planner_data pickle.
//
// Thread-safety: plain values; the functions are reentrant.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "core/byte_io.h"
#include "engine/checksum_sidecar.h"
#include "shardpoint/metadata.h"

namespace shardpoint::engine {

struct CheckpointIndex {
  format::Metadata metadata;
  // Absent when the save wrote no checksums.
  std::optional<ChecksumSidecar> checksums;
  // Where each tensor blob's data record starts inside the blob.
  std::map<format::MetadataIndex, std::uint64_t> data_offsets;
};

// The index of `metadata` (storage_data filled), written as `metadata_bytes` (the exact
// `.metadata` contents). `checksums` may be null; data_offsets names tensor blobs only.
// REQUIRES metadata.planner_data_raw is null.
std::string encode_checkpoint_index(const format::Metadata& metadata, ByteSpan metadata_bytes,
                                    const ChecksumSidecar* checksums,
                                    const std::map<format::MetadataIndex, std::uint64_t>& data_offsets);

// True when `index` is well formed at both ends (magic, version, its own CRC-32C) and
// binds to exactly `metadata_bytes`.
bool index_matches(std::string_view index, ByteSpan metadata_bytes);

// Decodes an index (callers check index_matches first, on the bytes they read). Throws
// FormatError naming `source_name` and the field for malformed input.
CheckpointIndex decode_checkpoint_index(std::string_view index, std::string_view source_name);

}  // namespace shardpoint::engine
