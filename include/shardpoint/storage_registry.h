// Opening a Storage by location (location.h). Drivers register a URL scheme with a
// namespace-scope StorageRegistration at the end of their .cc file, and get the parsed
// Location (scheme, authority, path, query), never the text to split again:
//
//   namespace {
//   const StorageRegistration kFileRegistration{"file", &open_local_storage};
//   }  // namespace
//
// The registry knows no driver. Linkers drop unreferenced objects from static libraries,
// and with them such registrations, so the storage layer is linked whole
// (src/storage/CMakeLists.txt); libshardpoint.so holds every built-in driver.
//
// Built-in schemes:
//   "/abs/dir", "rel/dir", "file:///abs/dir"  local directory (local_storage.h)
//   "memory://name"                           process-wide in-memory namespace (memory_storage.h)
//
// Thread-safety: registration and lookup are thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/location.h"

namespace shardpoint {
class BufferPool;  // the bounded pool of aligned staging buffers (internal to the library)
}  // namespace shardpoint

namespace shardpoint::storage {

class Storage;

struct StorageOptions {
  // Staging buffers for writers, shared with the caller (the engine passes its one pool so
  // all memory stays bounded). A writer holds one buffer while it has appended bytes not yet
  // written (less than one buffer's worth; until commit for the last partial buffer), plus,
  // for the local driver, one full buffer its background thread is writing; a write_at() of
  // unaligned caller memory holds one while it runs. Size the pool for the writers open at
  // once, or they wait (a deadline in IoOptions turns a wait into an error).
  // nullptr: the driver makes its own pool of `default_pool_bytes` (buffers sized by the
  // driver), allocated on first use.
  std::shared_ptr<BufferPool> buffer_pool;
  std::size_t default_pool_bytes = std::size_t{64} << 20;
  // Allow O_DIRECT at all (WriteOptions::direct_io asks per writer). Off: always buffered.
  bool direct_io = true;
  // Most memory mappings open_source() keeps alive at once; past it sources use pread.
  std::size_t max_mmaps = 1000;
};

// A driver's entry: the storage rooted at `location`, whose scheme_name() is the scheme it
// registered. Throws UsageError naming location.text() for a location it does not take.
using OpenStorageFn = std::unique_ptr<Storage> (*)(const Location& location, const StorageOptions& options);

// Opens the storage a location names, by its scheme_name() ("file" for a local path).
// Throws UsageError naming the location and the accepted schemes when the scheme is not
// registered, and whatever the driver throws for a location it does not take. Does no I/O
// for "file" and "memory" (a missing directory is created by the first write).
std::unique_ptr<Storage> open_storage(const Location& location, const StorageOptions& options = {});
// Location::parse(url), then the above; also a UsageError for "" (empty text names nothing).
std::unique_ptr<Storage> open_storage(std::string_view url, const StorageOptions& options = {});

// Registers fn for scheme. Registering the same fn again is a no-op; a different fn for a
// registered scheme throws UsageError.
void register_storage_scheme(std::string_view scheme, OpenStorageFn fn);

// Registered schemes, sorted.
std::vector<std::string> registered_storage_schemes();

// Registers a scheme at static-initialization time (see the top of this file).
class StorageRegistration {
 public:
  StorageRegistration(std::string_view scheme, OpenStorageFn fn) { register_storage_scheme(scheme, fn); }
};

}  // namespace shardpoint::storage
