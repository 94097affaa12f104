// The checks consolidate() makes before it writes anything: Lightning's
// consolidate_checkpoint checks, in its order and with its messages (spec:
// docs/lightning-layout.md §4), for a checkpoint folder and an output that may each be a
// local path or a storage URL prefix; where the output goes; and that the shard files the
// checkpoint's .metadata names are there and long enough.
//
// Thread-safety: no shared state; the checks read the filesystem or list / HEAD the
// object store, so they race with anyone changing those meanwhile.
#pragma once

#include <string>

#include "shardpoint/consolidate.h"
#include "shardpoint/location.h"
#include "shardpoint/metadata.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

// The validation for options.checkpoint_folder (ignoring the meta.pt check for kDcp) and
// the output path (options.output_file, or "<folder>.consolidated"). Throws PlanError with
// Lightning's exact message (for URLs, worded for a prefix; these checks list / HEAD the
// object store, so they can also throw StorageError). UsageError for a bucket-root output
// URL or a bucket-root checkpoint without an explicit output. Returns where the output goes.
// No side effects.
Location validate_consolidate(const ConsolidateOptions& options);

// Where a single output file or object goes: the local folder or URL prefix holding it
// (a URL keeps its query) and its name there. Throws UsageError for a bucket-root URL.
struct OutputPlace {
  Location parent;
  std::string name;
};
OutputPlace place_of_output(const Location& output);

// Every file .metadata refers to is a safe relative path (no escape from the folder; for
// a local folder, `local_folder` non-empty, no symlink leading out of it either), exists
// in `input` and is long enough for each item's offset + length. Throws FormatError naming
// the file, the item and expected vs found; StorageError when a file is missing or
// cannot be stat'ed. One stat per file.
void check_item_files(const format::Metadata& md, storage::Storage& input, const std::string& local_folder);

}  // namespace shardpoint::engine
