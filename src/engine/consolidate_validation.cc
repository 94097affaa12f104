#include "engine/consolidate_validation.h"

#include <sys/stat.h>

#include <map>
#include <optional>

#include "format/checkpoint_path.h"
#include "shardpoint/error.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "storage/location.h"

namespace shardpoint::engine {
namespace {

constexpr const char* kMetaPt = "meta.pt";

// "<location>.consolidated" (Lightning's default output), the suffix on the URL's path.
storage::Location default_output_for(const storage::Location& folder) {
  if (!folder.is_remote()) return storage::Location::parse(folder.to_string() + ".consolidated");
  std::optional<storage::Location> parent = folder.parent();
  if (!parent) {
    throw UsageError("the checkpoint \"" + folder.to_string() + "\" is a bucket root: give --output_file");
  }
  return parent->child(folder.name() + ".consolidated");
}

void validate_local_folder(const ConsolidateOptions& options, const std::string& folder) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) throw PlanError("The provided checkpoint folder does not exist: " + folder);
  if (!S_ISDIR(st.st_mode)) {
    throw PlanError("The provided checkpoint path must be a folder, containing the checkpoint shards: " + folder);
  }
  if (options.layout != ConsolidateLayout::kDcp) {
    struct stat meta {};
    const std::string meta_path = storage::Location::parse(folder).child(kMetaPt).to_string();
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
void validate_remote_output(const std::string& output) {
  const OutputPlace place = place_of_output(output);
  bool exists = storage::open_storage(place.parent)->try_stat(place.name).has_value();
  if (!exists) exists = !storage::open_storage(output)->list("").empty();
  if (exists) {
    throw PlanError(
        "The path for the converted checkpoint already exists. Choose a different path by providing `--output_file` "
        "or move/delete the object first: " +
        output);
  }
}

// Lightning's checks worded for a URL prefix: objects under it, meta.pt among them.
void validate_remote_folder(const ConsolidateOptions& options, const std::string& folder) {
  auto input = storage::open_storage(folder);
  bool has_objects = input->try_stat(".metadata").has_value() || !input->list("").empty();
  if (!has_objects) {
    const storage::Location location = storage::Location::parse(folder);
    if (std::optional<storage::Location> parent = location.parent()) {
      if (storage::open_storage(parent->to_string())->try_stat(location.name())) {
        throw PlanError("The provided checkpoint path must be a folder, containing the checkpoint shards: " + folder +
                        " is an object, not a prefix with objects under it");
      }
    }
    throw PlanError("The provided checkpoint folder does not exist: there are no objects under " + folder);
  }
  if (options.layout != ConsolidateLayout::kDcp && !input->try_stat(kMetaPt)) {
    throw PlanError(
        "Only FSDP-sharded checkpoints saved with Lightning are supported for consolidation. The provided folder "
        "is not in that format (no meta.pt under it): " +
        folder);
  }
}

}  // namespace

OutputPlace place_of_output(const std::string& output) {
  const storage::Location location = storage::Location::parse(output);
  std::optional<storage::Location> parent = location.parent();
  if (!parent) {
    if (location.is_remote()) {
      throw UsageError("output \"" + output + "\" names a bucket or container, not an object under it");
    }
    return {location.to_string(), ""};  // "/" or ".": Lightning's "already exists" check comes first
  }
  return {parent->to_string(), location.name()};
}

std::string validate_consolidate(const ConsolidateOptions& options) {
  const storage::Location folder_location = storage::Location::parse(options.checkpoint_folder);
  const std::string folder = folder_location.to_string();
  if (folder_location.is_remote()) {
    validate_remote_folder(options, folder);
  } else {
    validate_local_folder(options, folder);
  }
  const storage::Location output_location =
      options.output_file.empty() ? default_output_for(folder_location) : storage::Location::parse(options.output_file);
  const std::string output = output_location.to_string();
  if (output_location.is_remote()) {
    validate_remote_output(output);
    return output;
  }
  struct stat out {};
  if (::stat(output.c_str(), &out) == 0) {
    throw PlanError(
        "The path for the converted checkpoint already exists. Choose a different path by providing `--output_file` "
        "or move/delete the file first: " +
        output);
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
