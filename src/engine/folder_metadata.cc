#include "engine/folder_metadata.h"

#include "engine/metadata_files.h"
#include "engine/safetensors_metadata.h"
#include "format/metadata_codec.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

FolderMetadata decode_folder_metadata(std::string metadata_bytes, storage::Storage& folder) {
  FolderMetadata out;
  out.metadata = format::decode_metadata(as_bytes(metadata_bytes), folder.describe_key(kMetadataKey));
  out.raw_tensor_items = resolve_safetensors_items(out.metadata, folder);
  out.metadata_bytes = std::move(metadata_bytes);
  return out;
}

FolderMetadata read_folder_metadata(storage::Storage& folder) {
  if (std::optional<std::string> bytes = try_read_checkpoint_metadata(folder)) {  // per-rank files too
    return decode_folder_metadata(std::move(*bytes), folder);
  }
  if (folder_kind(folder) == CheckpointKind::kHfSafetensors) {
    FolderMetadata out;
    out.kind = CheckpointKind::kHfSafetensors;
    out.metadata = read_hf_metadata(folder);
    out.raw_tensor_items = true;
    return out;
  }
  throw StorageError(StorageError::Kind::kNotFound,
                     folder.describe_key(kMetadataKey) + ": not a committed checkpoint (no .metadata)");
}

}  // namespace shardpoint::engine
