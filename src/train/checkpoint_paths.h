// Where the trainer's checkpoints live and how it finds them: a checkpoint path is a local
// path or an object-store URL (storage::Location); a sharded checkpoint is a folder (or
// URL prefix) holding meta.pt, a full one a file (or object). These are the filesystem and
// object-store questions Lightning's Trainer asks about checkpoint paths, answered through
// std::filesystem for local paths and storage/ for URLs.
//
// Every function here is rank 0's view: no collectives; the caller broadcasts results.
// Thread-safety: no shared state; results race with anyone changing the files meanwhile.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "train/fsdp_strategy.h"

namespace shardpoint::train {

// An absolute, normal local path ("..", "." and trailing '/' resolved lexically), or a
// normalised URL (storage::Location). Throws UsageError for a URL with "?options":
// checkpoint names are appended to the root's path, so options have to come from the
// environment.
std::string normalize_checkpoint_path(const std::string& path);

// (the folder or prefix holding path, its name there). Throws UsageError for a bucket root
// or "/" (nothing holds them).
std::pair<std::string, std::string> parent_and_name(const std::string& path);

// True when a file or folder is at path (local), or an object at it or any object under it
// as a prefix (URL).
bool path_exists(const std::string& path);

// Removes the file or folder at path (local, recursively), or the object at it and every
// object under it as a prefix (URL). A missing path is not an error.
void remove_path(const std::string& path);

// Lightning's rule (docs/lightning-layout.md §1): kSharded when path is a folder (prefix)
// holding meta.pt, kFull when it is a regular file (object), nullopt when neither.
std::optional<StateDictType> checkpoint_kind(const std::string& path);

// <root>/lightning_logs/version_<k>/checkpoints with k = 1 + the largest existing version
// (0 when none), normalised. Creates nothing. Throws UsageError for a root URL with
// "?options".
std::string next_checkpoints_dir(const std::string& root);

// The checkpoint ckpt_path="last" means under root: the committed checkpoints named
// last*.ckpt in <root>/lightning_logs/version_*/checkpoints (a folder counts when it holds
// .metadata and meta.pt, the commit markers; a file when it exists), the newest being the
// one of the highest version, then the highest -v<n>. Normalised; "" when there is none.
std::string resolve_last_checkpoint(const std::string& root);

}  // namespace shardpoint::train
