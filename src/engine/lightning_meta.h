// Lightning's meta.pt (docs/lightning-layout.md §1, §3): the torch.save file of trainer
// state beside a sharded checkpoint's DCP files, and its commit marker: Lightning takes a
// folder for a sharded checkpoint only when meta.pt is in it, and writes it after the DCP
// save has committed. Tools that rewrite the DCP part (reshard) carry it over byte for
// byte so that the output stays a checkpoint Lightning resumes from.
//
// Thread-safety: free functions; concurrent calls on different folders are safe.
#pragma once

#include <optional>
#include <string>

#include "shardpoint/storage.h"
#include "shardpoint/zip_crc_counts.h"

namespace shardpoint::engine {

// The file's name inside the checkpoint folder (Lightning's _METADATA_FILENAME).
inline constexpr const char* kLightningMetaName = "meta.pt";

struct LightningMeta {
  std::string bytes;  // the whole file, as read
  ZipCrcCounts crc;   // what check_crc checked (all zeros without it)
};

// Reads `folder`'s meta.pt whole (it is small: trainer state, no module weights), or
// returns nullopt when there is none. With check_crc, every record is checked against the
// zip's central directory (headers and CRC-32; a record stored without one counts as
// records_no_checksum). Throws FormatError "<folder url>/meta.pt: ..." when it is not a zip
// or a record does not match, StorageError when it cannot be read. Blocking.
std::optional<LightningMeta> read_lightning_meta(storage::Storage& folder, bool check_crc);

// Publishes meta.pt in `folder` in one atomic write (durable: fsynced, and the folder).
// Call only after the folder's `.metadata` is committed: meta.pt marks the folder a
// complete Lightning checkpoint. Idempotent. Throws StorageError. Blocking.
void publish_lightning_meta(storage::Storage& folder, const LightningMeta& meta, bool durable);

}  // namespace shardpoint::engine
