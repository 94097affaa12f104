#include "engine/consolidate_validation.h"

#include <sys/stat.h>

#include <map>
#include <optional>

#include "engine/checkpoint_location.h"
#include "format/checkpoint_path.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::engine {
namespace {

constexpr const char* kMetaPt = "meta.pt";

// "<location>.consolidated" (Lightning's default output), the suffix on the URL's path.
Location default_output_for(const Location& folder) {
  if (!folder.is_remote()) return Location::parse(folder.to_string() + ".consolidated");
  std::optional<Location> parent = folder.parent();
  if (!parent) {
    throw UsageError("the checkpoint \"" + folder.to_string() + "\" is a bucket root: give --output_file");
  }
  return parent->child(folder.name() + ".consolidated");
}

// What the folder holds, as locate_checkpoint() decides: a torch.save file at its place is
// Lightning's "must be a folder"; nothing there (locate's StorageError: a local path that
// cannot be stat'ed, a URL with nothing under it or at it) is "does not exist".
void check_folder_exists(const Location& where) {
  CheckpointLocation location;
  try {
    location = locate_checkpoint(where);
  } catch (const StorageError& e) {
    if (!where.is_remote() || e.kind() == StorageError::Kind::kNotFound) {
      throw PlanError(std::string("The provided checkpoint folder does not exist: ") +
                      (where.is_remote() ? "there are no objects under " : "") + where.to_string());
    }
    throw;
  }
  if (!location.is_folder()) {
    throw PlanError("The provided checkpoint path must be a folder, containing the checkpoint shards: " +
                    where.to_string() + (where.is_remote() ? " is an object, not a prefix with objects under it" : ""));
  }
}

void validate_local_folder(const ConsolidateOptions& options, const Location& where) {
  const std::string& folder = where.to_string();
  check_folder_exists(where);
  if (options.layout != ConsolidateLayout::kDcp) {
    struct stat meta {};
    const std::string meta_path = where.child(kMetaPt).to_string();
    if (::stat(meta_path.c_str(), &meta) != 0 || !S_ISREG(meta.st_mode)) {
      throw PlanError(
          "Only FSDP-sharded checkpoints saved with Lightning are supported for consolidation. The provided folder "
          "is not in that format: " +
          folder);
    }
  }
}

// The output checks for an object-store URL: no object under the key, none under it as a
// prefix (a folder of safetensors shards).
void validate_remote_output(const Location& output) {
  const OutputPlace place = place_of_output(output);
  bool exists = storage::open_storage(place.parent)->try_stat(place.name).has_value();
  if (!exists) exists = !storage::open_storage(output)->list("").empty();
  if (exists) {
    throw PlanError(
        "The path for the converted checkpoint already exists. Choose a different path by providing `--output_file` "
        "or move/delete the object first: " +
        output.to_string());
  }
}

// Lightning's checks worded for a URL prefix: objects under it, meta.pt among them.
void validate_remote_folder(const ConsolidateOptions& options, const Location& where) {
  const std::string& folder = where.to_string();
  auto input = storage::open_storage(where);
  bool has_objects = input->try_stat(".metadata").has_value() || !input->list("").empty();
  if (!has_objects) check_folder_exists(where);
  if (options.layout != ConsolidateLayout::kDcp && !input->try_stat(kMetaPt)) {
    throw PlanError(
        "Only FSDP-sharded checkpoints saved with Lightning are supported for consolidation. The provided folder "
        "is not in that format (no meta.pt under it): " +
        folder);
  }
}

}  // namespace

OutputPlace place_of_output(const Location& output) {
  std::optional<Location> parent = output.parent();
  if (!parent) {
    if (output.is_remote()) {
      throw UsageError("output \"" + output.text() + "\" names a bucket or container, not an object under it");
    }
    return {output, ""};  // "/" or ".": Lightning's "already exists" check comes first
  }
  return {*parent, output.name()};
}

Location validate_consolidate(const ConsolidateOptions& options) {
  // Consolidate normalises what it was given (its messages and output name the canonical text).
  const Location folder_location = options.checkpoint_folder.canonical();
  if (folder_location.is_remote()) {
    validate_remote_folder(options, folder_location);
  } else {
    validate_local_folder(options, folder_location);
  }
  Location output = options.output_file ? options.output_file->canonical() : default_output_for(folder_location);
  if (output.is_remote()) {
    validate_remote_output(output);
    return output;
  }
  struct stat out {};
  if (::stat(output.to_string().c_str(), &out) == 0) {
    throw PlanError(
        "The path for the converted checkpoint already exists. Choose a different path by providing `--output_file` "
        "or move/delete the file first: " +
        output.to_string());
  }
  return output;
}

void check_item_files(const format::Metadata& md, storage::Storage& input, const std::string& local_folder) {
  std::map<std::string, std::uint64_t> sizes;
  for (const auto& [index, info] : md.storage_data) {
    if (!format::is_safe_relative_path(info.relative_path)) {
      throw FormatError(input.describe_key(".metadata") + ": item \"" + index.fqn + "\": relative_path '" +
                        info.relative_path + "' escapes the checkpoint folder");
    }
    auto it = sizes.find(info.relative_path);
    if (it == sizes.end()) {
      // Symlinks inside a local folder must not lead out of it (once per file).
      if (!local_folder.empty()) format::resolve_item_path(local_folder, info.relative_path);
      it = sizes.emplace(info.relative_path, input.stat(info.relative_path)).first;
    }
    if (info.offset + info.length > it->second) {
      throw FormatError(input.describe_key(info.relative_path) + ": item \"" + index.fqn + "\": expected " +
                        std::to_string(info.offset + info.length) + " bytes (offset " + std::to_string(info.offset) +
                        " + length " + std::to_string(info.length) + "), found " + std::to_string(it->second) +
                        " (truncated shard file)");
    }
  }
}

}  // namespace shardpoint::engine
