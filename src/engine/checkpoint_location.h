// What a location (a local path or a storage URL, parsed once into a Location) holds: a DCP
// folder, a Hugging Face folder or a torch.save file, and opening a torch.save file found
// there. This is the one place that decides it: inspect, verify, reshard and consolidate's
// input checks ask locate_checkpoint(); readers of a folder already opened ask folder_kind().
// Thread-safe (no shared state).
#pragma once

#include <memory>
#include <string>

#include "shardpoint/checkpoint.h"
#include "shardpoint/location.h"
#include "shardpoint/storage.h"
#include "torchfile/torch_file.h"

namespace shardpoint::engine {

// What the folder holds: kDcp with `.metadata`; else kHfSafetensors with
// model.safetensors.index.json or a top-level *.safetensors file; else kDcp (its readers
// then say "no .metadata"). One stat, plus one list when there is no `.metadata`.
CheckpointKind folder_kind(storage::Storage& folder);

// What `where` names. Local paths: a folder is a DCP or
// Hugging Face checkpoint (folder_kind), a file a torch.save file (an absent path throws
// StorageError kNotFound naming it). URLs: DCP metadata, model.safetensors.index.json or
// *.safetensors under the URL makes a folder (folder_kind); otherwise an object at the URL's
// last segment is a torch.save file; otherwise StorageError kNotFound "<url>/.metadata: not
// a committed checkpoint (no .metadata)".
// Authentication and network errors propagate (StorageError naming the URL).
struct CheckpointLocation {
  CheckpointKind kind = CheckpointKind::kTorchSave;
  bool is_folder() const { return kind != CheckpointKind::kTorchSave; }
  std::string name;                           // the path or URL as given (Location::text())
  std::shared_ptr<storage::Storage> storage;  // a folder: the checkpoint; torch.save: its parent
  std::string key;                            // torch.save behind a URL: the object's key
  std::string local_file;                     // torch.save on the local filesystem
};
CheckpointLocation locate_checkpoint(const Location& where);

// Opens the torch.save file of a location (REQUIRES !is_folder()) for pread / ranged reads
// (never mapped). Throws StorageError / FormatError naming it.
std::unique_ptr<torchfile::TorchFile> open_torch_file(const CheckpointLocation& location);
// The source open_torch_file() reads (REQUIRES !is_folder()). Throws StorageError naming it.
std::unique_ptr<ByteSource> open_torch_source(const CheckpointLocation& location);

}  // namespace shardpoint::engine
