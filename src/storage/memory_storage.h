// MemoryStorage: the "memory" driver. Objects live in a process-wide in-memory namespace,
// for engine tests (they fake storage with this, never the disk).
//
// URL "memory://name": every open of the same name sees the same objects, for the life of
// the process (until drop_memory_storage(name)). "memory://" (empty name) opens a fresh
// private namespace that disappears with the last Storage and source using it.
// Names may not contain '?' or '#' (UsageError).
//
// Semantics follow the local driver: writers publish on commit (atomically), an uncommitted
// writer leaves nothing, read past the end is a FormatError, sources keep the bytes they
// were opened with (objects are immutable, shared, never copied on read).
// features(): range_reads, atomic_publish, parallel_writes; no direct_io, local_path,
// conditional_put. Cancellation is checked at each call.
// Thread-safety: all methods are thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::storage {

// Registry entry for "memory://name". Throws UsageError for another scheme, a query or a
// fragment.
std::unique_ptr<Storage> open_memory_storage(const Location& location, const StorageOptions& options);

// Forgets the named namespace; storages already open keep using it. Idempotent.
void drop_memory_storage(std::string_view name);

}  // namespace shardpoint::storage
