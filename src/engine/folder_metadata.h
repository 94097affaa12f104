// The Metadata of a checkpoint folder, whichever writer made it: DCP's `.metadata` (torch.save
// items, or safetensors items: safetensors_metadata.h) or a Hugging Face safetensors folder.
// The one place CheckpointReader and PlannedReader (and load's coordinator) learn what a
// folder holds.
//
// Thread-safety: no shared state; reads through `folder`.
#pragma once

#include <optional>
#include <string>

#include "engine/checkpoint_location.h"
#include "shardpoint/metadata.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

struct FolderMetadata {
  CheckpointKind kind = CheckpointKind::kDcp;
  format::Metadata metadata;
  // kDcp: the `.metadata` bytes as read (the load index and PyTorch's readers take these).
  std::optional<std::string> metadata_bytes;
  // Every tensor item's storage_data names the chunk's raw row-major little-endian bytes
  // (safetensors_metadata.h): read them at blob offset 0, there is no zip to parse or check.
  bool raw_tensor_items = false;
};

// Reads `.metadata` when the folder has one (and resolves safetensors items), else the
// Hugging Face files (read_hf_metadata). Throws StorageError kNotFound "<folder>/.metadata:
// not a committed checkpoint (no .metadata)" when it has neither; FormatError for a bad
// `.metadata` or safetensors header; StorageError on I/O.
FolderMetadata read_folder_metadata(storage::Storage& folder);

// Completes a FolderMetadata of kind kDcp from `.metadata` bytes already read.
FolderMetadata decode_folder_metadata(std::string metadata_bytes, storage::Storage& folder);

}  // namespace shardpoint::engine
