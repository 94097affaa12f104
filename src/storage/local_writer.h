// The writer of the "file" driver (storage/local_storage.h describes its protocol: a
// temporary file beside the key, O_DIRECT with a buffered fallback, background writes of
// full staging buffers, fsync + rename + directory fsync at commit). Internal to src/storage.
#pragma once

#include <memory>
#include <string>

#include "shardpoint/storage.h"
#include "storage/local_files.h"

namespace shardpoint::storage::local {

// Creates the missing parent directories of `key` and its temporary file; the writer
// publishes it under `key` at commit() and deletes it when destroyed uncommitted. Throws
// StorageError (mkdir, open). Thread-safety: as StorageWriter.
std::unique_ptr<StorageWriter> open_local_writer(std::shared_ptr<LocalRoot> root, std::string key,
                                                 const WriteOptions& options);

}  // namespace shardpoint::storage::local
