// ObjectStoreStorage: the Storage interface over an object store's protocol, shared by the
// S3 (XML API, also GCS with HMAC keys), GCS JSON and Azure Blob drivers. The driver
// implements ObjectClient (the requests: HEAD-like metadata, ranged GETs, whole PUTs,
// writers, list, delete); this class adds what every object store does the same way: key
// validation, IoOptions checks, not-found and past-the-end errors, sources (small objects
// fetched whole, looked at again when replaced between the HEAD and the GET; larger ones
// through read-ahead windows pinned to the version seen at open), sorted listings and
// parallel deletes for remove_prefix(). Drivers build their writers with
// http/upload_writer.h.
//
// Features: range_reads, atomic_publish (an object store publishes a PUT or a finished
// upload whole), object_store, and
// conditional_put (WriteOptions::if_absent: the drivers' conditional requests; a
// write_atomic() refused because an object exists is compared with that object, and one with
// exactly its bytes counts as written, since that is what a retried request finds when its
// first attempt succeeded but the answer was lost). Thread-safety: as storage.h; ObjectClient
// methods are called from any number of threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/error.h"
#include "shardpoint/storage.h"

namespace shardpoint::storage::http {

// How open_source() reads (see the drivers' configs for the trade-offs).
struct SourceLimits {
  std::size_t whole_bytes = std::size_t{1} << 20;   // objects up to this size are fetched at open
  std::size_t window_bytes = std::size_t{4} << 20;  // read-ahead window of larger ones
  // Windows cached per source, and by all the storage's open sources together: their blocks
  // share one budget of windows x window_bytes (http/ranged_reads.h ReadAheadBudget).
  int windows = 4;
  // Fetches ahead at once per source (http/ranged_reads.h; at most windows - 1): each is a
  // GET of up to a window in flight beside the readers' own, on a thread of the source's
  // own. Their blocks count in the cache above (no more memory).
  int windows_ahead = 4;
};

class ObjectClient : public std::enable_shared_from_this<ObjectClient> {
 public:
  // What an object is now: its size and a version tag (S3 / Azure ETag, GCS generation).
  struct Version {
    std::uint64_t size = 0;
    std::string tag;
  };

  virtual ~ObjectClient() = default;

  // "s3://bucket/prefix", "az://container/prefix": the root as URLs and messages show it
  // (no query).
  virtual std::string root_url() const = 0;
  // `S3 object "s3://b/p/key"`: how errors name an object.
  virtual std::string describe(std::string_view key) const = 0;
  virtual SourceLimits source_limits() const = 0;

  // What an open found: the object's version, and its first `length` bytes.
  struct FirstBytes {
    Version version;
    std::shared_ptr<std::byte[]> bytes;  // at least length bytes; null when length is 0
    std::size_t length = 0;
  };

  // The object's size and version; nullopt when there is none. `op` starts messages.
  virtual std::optional<Version> head(std::string_view key, const IoOptions& io, const std::string& op) = 0;
  // Opens an object in one request where the driver can: its version and its first
  // min(size, max_bytes) bytes. S3 and Azure ask for them in one ranged GET and read the
  // size and ETag off the answer (a HEAD less). This default: open_with_head(). nullopt when there is
  // no object. Throws as head() and read_into(); REQUIRES max_bytes > 0.
  virtual std::optional<FirstBytes> read_first(std::string_view key, std::size_t max_bytes, const IoOptions& io,
                                               const std::string& op);
  // head(), then, when the object has at most max_bytes, all of it (read_into() pinned to
  // that version; length 0 otherwise). nullopt when there is no object. Throws as those.
  std::optional<FirstBytes> open_with_head(std::string_view key, std::size_t max_bytes, const IoOptions& io,
                                           const std::string& op);
  // Fills out with the bytes at offset (parallel ranged GETs when large). A non-empty tag
  // pins the version: a changed object is StorageError kOther. Past the end: FormatError.
  virtual void read_into(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io,
                         const std::string& op, const std::string& tag) = 0;
  // One request that publishes the whole object. With options.if_absent the request is
  // conditional on no object existing (S3 / Azure If-None-Match: *, GCS ifGenerationMatch=0)
  // and a refusal is StorageError kAlreadyExists (conflict_error()).
  virtual void put(std::string_view key, ByteSpan data, const IoOptions& io, const std::string& op,
                   const WriteOptions& options) = 0;
  // A writer whose commit honours options.if_absent as put() does.
  virtual std::unique_ptr<StorageWriter> open_writer(const std::string& key, const WriteOptions& options) = 0;
  // Every object under prefix, keys relative to the root, temporaries left out, any order.
  virtual std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io, const std::string& what) = 0;
  // Deletes one object; a missing one is not an error.
  virtual void remove(std::string_view key, const IoOptions& io, const std::string& what) = 0;
  // Cleans up what failed writers left under prefix (S3: unfinished multipart uploads).
  virtual void remove_leftovers(std::string_view prefix, const IoOptions& io) {}
};

// A Storage over client; `query` is the URL's query as given (url() returns it).
std::unique_ptr<Storage> make_object_store_storage(std::shared_ptr<ObjectClient> client, std::string query);

// The error of a create-only publish the service refused because an object exists:
// "<what>: already exists (HTTP <status> <code>: another writer published it first)".
StorageError conflict_error(const std::string& what, long status, const std::string& code);

}  // namespace shardpoint::storage::http
