// LocalStorage: the "file" driver. Objects are regular files under a root directory; a key
// "a/b" is the file <root>/a/b. URLs: a plain path ("ckpt", "/data/ckpt") or
// "file:///data/ckpt" (host empty or "localhost"; no query or fragment).
//
// Writing protocol (each step's reason is in local_writer.cc):
//   1. open_writer creates missing parent directories and a temporary file
//      "<root>/a/b.sp-tmp.<pid>.<n>" next to the target, with O_DIRECT when asked and allowed.
//   2. append() stages bytes in a buffer leased from the BufferPool and pwrites each full
//      buffer (then returns it to the pool); a page-aligned caller buffer of at least one
//      pool buffer goes to the file without the copy. write_at() writes the aligned middle
//      of a range with O_DIRECT (from caller memory when its alignment matches the offset,
//      else through a pool buffer) and its unaligned head and tail through a second,
//      buffered descriptor, so neighbouring items never share a direct-written block.
//   3. commit() writes the last partial block (zero-padded to the alignment, then
//      ftruncate to the exact size), fsyncs the file (durable), renames it onto the key and
//      fsyncs the directory (durable). A crash before the rename leaves only a temporary
//      file, which list() ignores and remove_prefix() deletes (also those of writers still
//      running in other processes: clean up only what nobody is writing).
// O_DIRECT: tried at the first direct open; a filesystem that refuses it (EINVAL: ramfs,
// tmpfs before Linux 6.6, some FUSE) is remembered and later writers go buffered. A direct pwrite refused with
// EINVAL switches that file to buffered I/O (fcntl) and is retried.
//
// Reads open the file per call (pread); open_source() maps it (at most
// StorageOptions::max_mmaps mappings alive, then pread sources, as LevelDB's mmap limiter).
//
// Cancellation: checked at each call and between buffer-sized chunks; a blocked pwrite or
// fsync is not interrupted.
// Thread-safety: all Storage methods are thread-safe; see StorageWriter for writers.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::storage {

// Opens the local directory `root` (need not exist yet: it is created by the first write).
// Throws UsageError when root is empty.
std::unique_ptr<Storage> open_local_storage_at(const std::string& root, const StorageOptions& options = {});

// Registry entry for "file://..." and plain paths. Throws UsageError for a file URL with a
// host other than "localhost", a query or a fragment (Location::parse does), and for a remote
// location.
std::unique_ptr<Storage> open_local_storage(const Location& location, const StorageOptions& options);

}  // namespace shardpoint::storage
