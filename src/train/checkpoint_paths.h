// Where the trainer's checkpoints live and how it finds them: a checkpoint path is a local
// path or an object-store URL (Location); a sharded checkpoint is a folder (or
// URL prefix) holding meta.pt, a full one a file (or object). These are the filesystem and
// object-store questions Lightning's Trainer asks about checkpoint paths, answered through
// std::filesystem for local paths and storage/ for URLs.
//
// Every function here is rank 0's view: no collectives; the caller broadcasts results.
// Thread-safety: no shared state; results race with anyone changing the files meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardpoint/location.h"
#include "torchfile/torch_file.h"
#include "train/fsdp_strategy.h"

namespace shardpoint::train {

// The location made absolute (a local path: "..", "." resolved lexically; a URL as it
// is). Throws UsageError for a URL with "?options": checkpoint names are appended to the
// root's path, so options have to come from the environment.
Location normalize_checkpoint_path(const Location& path);

// (the folder or prefix holding path, its name there). Throws UsageError for a bucket root
// or "/" (nothing holds them).
std::pair<Location, std::string> parent_and_name(const Location& path);

// Opens the torch.save file `name` under `dir` (a path or URL). Throws what opening and
// parsing throw; when data.pkl does not parse and its zip CRC-32 mismatches, that mismatch
// (FormatError naming "dir/name") instead.
std::unique_ptr<torchfile::TorchFile> open_torch_file(const Location& dir, const std::string& name);

// True when a file or folder is at path (local), or an object at it or any object under it
// as a prefix (URL).
bool path_exists(const Location& path);

// Lightning's rule (docs/lightning-layout.md §1): kSharded when path is a folder (prefix)
// holding meta.pt, kFull when it is a regular file (object), nullopt when neither.
std::optional<StateDictType> checkpoint_kind(const Location& path);

// <root>/lightning_logs/version_<k>/checkpoints with k = 1 + the largest existing version
// (0 when none), normalised. Creates nothing. Throws UsageError for a root URL with
// "?options".
Location next_checkpoints_dir(const Location& root);

// What ckpt_path="last" resumes from (resolve_last_checkpoint).
struct LastCheckpoint {
  std::optional<Location> path;  // normalised; nullopt when root holds no committed checkpoint
  std::string note;              // one line when path is not the newest last*.ckpt (why), else ""
};

// The checkpoint ckpt_path="last" means under root: the newest committed checkpoint of
// <root>/lightning_logs/version_*/checkpoints, by version folder, then global_step, then a
// last*.ckpt before other names at the same step, then the highest -v<n>. A folder counts
// when it holds .metadata and meta.pt (the commit markers), a file when it exists; hidden
// names (staging folders, temporary files) never count, so a half-written checkpoint is
// never chosen. With atomic replacement the newest committed checkpoint is the newest
// last*.ckpt; when it is not (that save died: its last*.ckpt is uncommitted, missing or
// older than the top-k checkpoint saved just before it), `note` says which one was passed
// over. Reads meta.pt (or the full file's pickle) of each committed checkpoint of the
// newest version folder. Throws StorageError when listing or reading fails.
LastCheckpoint resolve_last_checkpoint(const Location& root);

// The hidden sibling a local sharded save into `path` is written in before it is swapped
// in (storage::replace_local_folder): engine::staging_path tagged with the step,
// <parent>/.<name>.sp-replace-<step>. REQUIRES a local path.
Location staging_path_for(const Location& path, std::int64_t step);

// Staging leftovers (engine::remove_stale_staging) and removal (engine::remove_checkpoint)
// are the engine's rules, shared with the C API (engine/checkpoint_files.h).

// The local checkpoints folders <root>/lightning_logs/version_*/checkpoints that exist
// (none for a URL root).
std::vector<Location> local_checkpoints_dirs(const Location& root);

}  // namespace shardpoint::train
