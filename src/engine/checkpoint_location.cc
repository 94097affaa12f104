#include "engine/checkpoint_location.h"

#include <sys/stat.h>

#include <cerrno>
#include <optional>

#include "core/byte_stream.h"
#include "engine/metadata_files.h"
#include "engine/safetensors_metadata.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::engine {

std::string_view checkpoint_kind_name(CheckpointKind kind) {
  switch (kind) {
    case CheckpointKind::kDcp: return "dcp";
    case CheckpointKind::kHfSafetensors: return "hf-safetensors";
    case CheckpointKind::kTorchSave: return "torch";
  }
  return "torch";
}

namespace {

// A Hugging Face safetensors folder: its index JSON, or any of its tensor files.
bool is_hf_folder(storage::Storage& folder) {
  if (folder.try_stat(kHfIndexKey)) return true;
  for (const storage::ObjectInfo& o : folder.list("")) {
    if (is_hf_tensor_file(o.key)) return true;
  }
  return false;
}

}  // namespace

CheckpointKind folder_kind(storage::Storage& folder) {
  if (has_checkpoint_metadata(folder)) return CheckpointKind::kDcp;
  return is_hf_folder(folder) ? CheckpointKind::kHfSafetensors : CheckpointKind::kDcp;
}

CheckpointLocation locate_checkpoint(const Location& where) {
  CheckpointLocation location;
  const std::string& name = where.text();
  location.name = name;
  if (!where.is_remote()) {
    const std::string& path = where.path();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw_os_error("open", path, errno);
    if (S_ISDIR(st.st_mode)) {
      location.storage = storage::open_storage(where);
      location.kind = folder_kind(*location.storage);
    } else {
      location.local_file = path;
    }
    return location;
  }
  std::shared_ptr<storage::Storage> folder = storage::open_storage(where);
  // A prefix holding a checkpoint wins over an object of its name, and is looked for first:
  // some servers fail a stat of a key that is only a prefix (s3s-fs: HTTP 500, retried).
  const bool dcp = has_checkpoint_metadata(*folder);
  if (dcp || is_hf_folder(*folder)) {
    location.kind = dcp ? CheckpointKind::kDcp : CheckpointKind::kHfSafetensors;
    location.storage = std::move(folder);
    return location;
  }
  // A torch.save object: the URL's last segment is its key (a URL written with a trailing
  // '/' names a prefix, not an object).
  const std::optional<Location> parent = where.parent();
  if (parent && !where.trailing_slash()) {
    std::shared_ptr<storage::Storage> holder = storage::open_storage(*parent);
    std::optional<std::uint64_t> size;
    try {
      size = holder->try_stat(where.name());
    } catch (const UsageError&) {
      // Not a valid key (e.g. "..."): not an object either.
    }
    if (size) {
      location.storage = std::move(holder);
      location.key = where.name();
      return location;
    }
  }
  throw StorageError(StorageError::Kind::kNotFound,
                     folder->describe_key(kMetadataKey) + ": not a committed checkpoint (no .metadata)");
}

std::unique_ptr<ByteSource> open_torch_source(const CheckpointLocation& location) {
  if (location.is_folder()) throw UsageError(location.name + ": a checkpoint folder, not a torch.save file");
  if (!location.local_file.empty()) return FileSource::open(location.local_file);
  storage::SourceOptions options;
  options.prefer_mmap = false;
  return location.storage->open_source(location.key, options);
}

std::unique_ptr<torchfile::TorchFile> open_torch_file(const CheckpointLocation& location) {
  return torchfile::TorchFile::open(open_torch_source(location));
}

}  // namespace shardpoint::engine
