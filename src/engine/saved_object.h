// Bytes items (objects torch.save pickles into one blob, docs/dcp-format.md §2.5): read
// whole (decompressed when stored through zstd, §2.4), verified against the sidecar's item checksum or, without one,
// the zip CRC-32s of their records, and opened as the torch.save archive they are.
//
// Thread-safety: free functions; `file` must allow concurrent reads when called from
// several threads, and checksums.zip_crc is thread-safe.
#pragma once

#include <memory>
#include <string>

#include "engine/item_reader.h"
#include "shardpoint/byte_stream.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/metadata.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/torch_file.h"

namespace shardpoint::engine {

// Reads the bytes item `info` of `file` whole, verifies it when checksums.item is set (else
// checks its zip CRC-32s when checksums.zip_crc is set), and returns it opened: a torch.save
// archive in memory whose root is the object torch.load would return; the storages of
// tensors the object holds are its data/<key> records (docs/dcp-format.md §2.5). Adds the
// blob's length to counts.data_bytes. Throws FormatError naming the file and fqn,
// StorageError.
std::unique_ptr<torchfile::TorchFile> open_saved_object(const std::shared_ptr<const ByteSource>& file,
                                                        const format::StorageInfo& info, const std::string& fqn,
                                                        const BlobChecksums& checksums, ReadCounts& counts);

// open_saved_object(...)->root().
pickle::ValuePtr read_saved_object(const std::shared_ptr<const ByteSource>& file, const format::StorageInfo& info,
                                   const std::string& fqn, const BlobChecksums& checksums, ReadCounts& counts);

// The torch.save blob of item `info` of `file`, whole in memory: its stored bytes, or what
// they decompress to (a zstd item, docs/dcp-format.md §2.4; held whole, at most 4 GiB).
// Verifies the stored bytes against checksums.item when set (no zip CRC-32 checks). Adds
// the stored length to counts.data_bytes. `where` names the item in errors. Throws
// FormatError (unknown transform, range outside the file, corrupt data, checksum
// mismatch), StorageError.
std::unique_ptr<ByteSource> read_item_blob(const std::shared_ptr<const ByteSource>& file,
                                           const format::StorageInfo& info, const std::string& where,
                                           const BlobChecksums& checksums, ReadCounts& counts);

}  // namespace shardpoint::engine
