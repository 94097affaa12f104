// WindowedStorage: a read-side StorageWrapper for parsers that make bursts of small reads.
// The zip and pickle parsers read each blob's headers with ~15 small reads at both of its
// ends; served from a few windows shared by every object of the storage, they cost one
// read per window instead of one system call or HTTP request each, and the memory held
// does not grow with the number of objects opened (a remote driver's own sources keep a
// cache per object). Reads of at least half a window go straight to the storage, into the
// caller's buffer.
//
// open_source() returns sources that read local files with pread (never mapped, so the
// pages read do not count in the process's RSS) and remote objects with one ranged
// Storage::read per call. Every other call is forwarded unchanged.
//
// Thread-safety: as the wrapped Storage; the shared windows are guarded by a mutex, and
// the sources may be read from several threads at once.
#pragma once

#include <cstddef>
#include <memory>

#include "shardpoint/storage.h"

namespace shardpoint::storage {

// Memory the shared windows hold at most (kWindows windows of kWindowBytes).
inline constexpr std::size_t kWindowBytes = std::size_t{128} << 10;
inline constexpr std::size_t kWindows = 8;
inline constexpr std::size_t kWindowCacheBytes = kWindowBytes * kWindows;

// Wraps `target` (REQUIRES non-null). The result keeps target alive. open_source() throws
// what the target's stat / open_source / read throw (StorageError naming the key).
std::shared_ptr<Storage> make_windowed_storage(std::shared_ptr<Storage> target);

}  // namespace shardpoint::storage
