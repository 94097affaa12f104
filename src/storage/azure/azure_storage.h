// The Azure Blob driver: "az" / "abfs" / "abfss". Objects are block blobs in one
// container under a prefix; key "a/b" is the blob "<prefix>/a/b".
//
// URLs (strict: no query, fragment, empty / "." / ".." segments; container names are 3-63
// lower-case letters, digits and single hyphens):
//   az://<container>[/<prefix>]                                  account from the credentials
//   abfs[s]://<container>@<account>.dfs.core.windows.net[/<prefix>]  (blob endpoint of that
//                                                                account; ".blob." also taken)
// Credentials and endpoint: azure_auth.h (connection string, account + key, SAS; a custom
// endpoint such as Azurite's path-style http://127.0.0.1:PORT/devstoreaccount1).
//
// The driver is an http::ObjectClient (Azure's requests, SharedKey or SAS signed) under the
// shared http::ObjectStoreStorage (http/object_store.h), so reads, sources and writers work
// as for s3:// and gs://.
//
// Writing protocol (http/upload_writer.h):
//   1. append() copies bytes into a buffer leased from the StorageOptions BufferPool; each
//      full buffer with more bytes behind it becomes one Put Block (block ids unique per
//      writer), sent on its own thread; at most AzureConfig::parallelism blocks are in
//      flight per writer, each holding its buffer until the block is stored (memory stays
//      bounded by the pool).
//   2. commit() of an object that fits in one buffer is one Put Blob. Otherwise it sends the
//      last block, waits for all, then Put Block List: the blob appears atomically, whole.
//   3. A writer destroyed without commit() (or whose commit or an append failed) stops and
//      waits for its blocks in flight and commits nothing: its uncommitted blocks are never
//      referenced by a block list, are invisible to readers and list(), and are
//      garbage-collected by the service (Azure drops uncommitted blocks after 7 days;
//      Azurite when its GC runs). A previous blob under the key stays intact.
//   write_atomic() is one Put Blob (block upload above the buffer size), so `.metadata` is
//   published in one step, after the data objects (the engine's order). WriteOptions::
//   if_absent adds If-None-Match: * to Put Blob / Put Block List; Azure's 409
//   BlobAlreadyExists (or 412) is StorageError kAlreadyExists. Blocks: at most 50,000 per
//   blob, so blocks grow past every 5,000 (http/upload_writer.h part_bytes_at).
// Reads: ranged GETs (x-ms-range) straight into the caller's buffer; a read larger than
// read_chunk_bytes is split into parallel ranged GETs. open_source() downloads blobs up to
// AzureConfig::source_whole_bytes whole and reads larger ones through a cache of read-ahead
// blocks (http/ranged_reads.h WindowedSource: source_cache_windows blocks of
// source_window_bytes, threads missing on one block share its fetch), every GET pinned to
// the ETag seen at open with If-Match: a large source whose blob was replaced or removed
// throws StorageError instead of returning the new bytes.
// Retries: 5xx, 408, 429, connection failures, timeouts, malformed answers, ranged GETs
// answered with another range (http_client.h) and bodies refused as damaged (every request
// with a body carries its Content-MD5; Azure answers a mismatch 400 Md5Mismatch), with
// exponential backoff and jitter (AzureConfig). Errors name the blob as `azure blob "az://c/p/key"`, the HTTP status,
// Azure's error code, the request id and the retry count; never the key or SAS.
// Status mapping: 404 -> kNotFound, 401/403 -> kPermission, retryable and a body refused
// as damaged -> kTransient, others -> kOther.
//
// features(): range_reads, atomic_publish (Put Blob / Put Block List), conditional_put. No
// parallel_writes (write_at), direct_io or local_path.
//
// Cancellation: IoOptions stop / deadline abort a transfer in progress (curl's progress
// callback) and stop retries; a writer's blocks in flight stop retrying and are waited for.
// Thread-safety: all Storage methods are thread-safe; writers are single-threaded.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "storage/azure/azure_auth.h"

namespace shardpoint::storage::azure {

struct AzureLocation {
  std::string scheme;           // "az", "abfs", "abfss"
  std::string account;          // from the URL (abfs) or empty (az)
  std::string endpoint_suffix;  // abfs: "core.windows.net" from <account>.dfs.<suffix>
  std::string container;
  std::string prefix;       // "" or "a/b" (no leading or trailing '/')
  std::string url() const;  // normalized: to_azure_location(Location::parse(url())) gives it back
};

// The Azure parts of an az://, abfs:// or abfss:// location: the container (and account) from
// its authority, the prefix from its path. Throws UsageError naming the URL and what is
// wrong (a query, an invalid container or account name, an empty, "." or ".." segment).
AzureLocation to_azure_location(const Location& location);

// Opens with an explicit configuration (tests, tools). Does no I/O. Throws UsageError for a
// bad URL, a missing account, or an abfs account that differs from the credentials'.
std::unique_ptr<Storage> open_azure_storage_with(const Location& url, const AzureConfig& config,
                                                 const StorageOptions& options = {});

// Registry entry: the configuration from azure_config_from_env().
std::unique_ptr<Storage> open_azure_storage(const Location& url, const StorageOptions& options);

// Creates the URL's container (Create Container); an existing one is fine. Throws
// StorageError as the driver does.
void create_azure_container(const Location& url, const AzureConfig& config);

}  // namespace shardpoint::storage::azure

namespace shardpoint::storage {
using azure::open_azure_storage;
}  // namespace shardpoint::storage
