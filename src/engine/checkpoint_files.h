// Lightning's rules for sharded checkpoint folders, in one place for the trainer (train/),
// the C API and, through it, the Python package: when a folder is committed, where a save
// that replaces one is staged, which committed checkpoints a folder holds, and how one is
// removed. LibTorch-free, so the C API links it.
//
// A sharded checkpoint is a folder (or URL prefix) holding DCP's data files, `.metadata`
// (written when the data is complete) and Lightning's `meta.pt` (written after it).
//
// Thread-safety: no shared state; results race with anyone changing the files meanwhile.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/location.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

// The commit markers, in the order a save writes them (and a removal deletes them in
// reverse): a folder is a committed checkpoint when it holds both.
inline constexpr std::string_view kDcpMetadataName = ".metadata";
inline constexpr std::string_view kLightningMetaName = "meta.pt";
inline constexpr std::array<std::string_view, 2> kCommitMarkers = {kDcpMetadataName, kLightningMetaName};

// The mark of a staging folder's name: ".<name>.sp-replace-<tag>".
inline constexpr std::string_view kStagingMarker = ".sp-replace-";
// Characters of a staging tag kept (a uuid's 32 hex digits are cut to 16: unique enough
// among the saves of one folder, and the name stays short).
inline constexpr std::size_t kStagingTagChars = 16;

// True when `storage` (a checkpoint folder) holds every commit marker. Throws StorageError
// for I/O failures other than a missing object.
bool is_committed(storage::Storage& storage);

// The same for a path or URL; false when nothing is there. Throws UsageError for a URL
// its driver refuses, StorageError for I/O failures.
bool is_committed(const Location& where);

// The hidden sibling a local save into `target` is written in before it is swapped in
// (storage::replace_local_folder): <parent>/.<name>.sp-replace-<tag>, tag cut to
// kStagingTagChars, `target` made absolute. Throws UsageError for a URL or a path with no
// name ("/", ".").
Location staging_path(const Location& target, std::string_view tag);

// True when `name` (one path segment) is a staging folder's name.
bool is_staging_name(std::string_view name);

// Removes the staging folders saves into the local `target` left when they failed
// (<parent>/.<name>.sp-replace-*). Returns how many went. REQUIRES no save into `target`
// is in flight. A URL or a missing parent is nothing to clean (0); a failure to remove one
// is skipped (best effort: the next save tries again).
std::size_t remove_stale_staging_of(const Location& target);

// Removes what killed saves left in a local checkpoints folder: staging folders and
// temporary files of unfinished atomic writes ("*.sp-tmp.*"). Returns how many entries
// went; best effort as above. A URL or a missing folder is nothing to clean (0).
std::size_t remove_stale_staging(const Location& dir);

// The committed checkpoints directly in the local `folder`, oldest first: by the `step=N`
// in their names (none: first), then by meta.pt's modification time, then by path. A
// missing folder holds none. Throws UsageError for a URL (object stores are not listed
// here).
std::vector<Location> list_committed_checkpoints(const Location& folder);

// Deletes the checkpoint at `where`, uncommitting it first: meta.pt, then
// `.metadata`, then everything else (a local folder recursively; under a URL, every object
// under it as a prefix), so a crash midway leaves nothing that looks committed. A single
// file (or object) is removed alone. Nothing there is not an error. Throws StorageError.
void remove_checkpoint(const Location& where);

}  // namespace shardpoint::engine
