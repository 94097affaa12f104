// Storage: where checkpoint bytes live. One small interface, several drivers.
//
// A Storage is rooted at one location (a local directory, a memory namespace, an
// object-store bucket prefix) and holds objects named by keys. A key is a relative path inside the root,
// segments separated by '/': "__0_0.distcp", ".metadata", "step=3/__1_0.distcp". Keys are
// validated by every call (validate_key): empty keys, absolute keys, empty, "." or ".."
// segments, NUL bytes, and the reserved temporary marker ".sp-tmp." are a UsageError naming
// the key. Directories are not objects: they appear and vanish with the keys under them.
//
// Drivers: local POSIX files ("file", local_storage.h), in-process memory ("memory",
// memory_storage.h), S3 ("s3"), GCS ("gs") and Azure Blob ("az", "abfs", "abfss"). Open one
// by URL with open_storage() (storage_registry.h). Behavior
// is added with wrappers (storage_wrapper.h, fault_injection_storage.h), not flags.
//
// Errors: StorageError (kind() says not found / permission / no space / transient / other)
// with the object named once, as the driver describes it (`local file "/a/b/__0_0.distcp"`,
// `memory object "memory://t/x"`); FormatError when a read asks for bytes past the end of an
// object; UsageError for invalid keys and misuse (write after commit, ...).
//
// Every call takes an IoOptions as its last (defaulted) parameter. Drivers check it when a
// call starts and between chunks of a long transfer; they cannot interrupt a system call
// that is already blocked (a pwrite of one chunk, an fsync).
//
// Thread-safety: every Storage method may be called from any number of threads at once.
// A StorageWriter is used by one thread at a time, except write_at() (see there).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/byte_stream.h"

namespace shardpoint::storage {

using Clock = std::chrono::steady_clock;

enum class IoPriority { kNormal, kLow, kHigh };

// Per-call options, as RocksDB's IOOptions. Defaults: no deadline, not cancellable.
struct IoOptions {
  // The call throws StorageError kTransient ("deadline exceeded") when it is still running
  // at this time (checked between chunks; a blocked syscall is not interrupted).
  Clock::time_point deadline = Clock::time_point::max();
  // When stop is requested the call throws StorageError kOther ("cancelled") at its next check.
  std::stop_token stop;
  // A hint; the local and memory drivers ignore it.
  IoPriority priority = IoPriority::kNormal;

  static IoOptions with_timeout(Clock::duration timeout) {
    IoOptions io;
    io.deadline = Clock::now() + timeout;
    return io;
  }
};

// Throws the deadline / cancellation error described at IoOptions, naming `what`.
void check_io(const IoOptions& io, std::string_view what);

// True when check_io() would throw. Cheap: lets hot loops skip building the `what` text.
inline bool io_expired(const IoOptions& io) {
  return io.stop.stop_requested() || (io.deadline != Clock::time_point::max() && Clock::now() >= io.deadline);
}

// What a driver can do. The engine picks its commit path from these.
struct StorageFeatures {
  // read() of any byte range costs about the bytes read (not the whole object).
  bool range_reads = false;
  // A committed writer / write_atomic() replaces the object in one step: readers see the old
  // bytes or the new ones, never a mixture or a partial object.
  bool atomic_publish = false;
  // Writers bypass the page cache (O_DIRECT) when WriteOptions::direct_io asks for it.
  bool direct_io = false;
  // WriteOptions::if_absent is honoured: a create-only publish fails with kAlreadyExists,
  // atomically with respect to other writers of the key (local: rename without replace;
  // S3 and Azure: If-None-Match: *; GCS: ifGenerationMatch=0). Drivers without it ignore
  // the option and replace the object.
  bool conditional_put = false;
  // Objects are files with a local path (local_path()), so open_source() can mmap them and
  // callers may use copy_file_range.
  bool local_path = false;
  // StorageWriter::write_at() is supported: several threads may write disjoint ranges of one
  // object at explicit offsets.
  bool parallel_writes = false;
  // Objects live on a service reached by requests (S3, Azure Blob, GCS), each object its
  // own upload and its own reads: items split across several objects move as that many
  // independent streams (a GCS session takes one object's chunks one at a time, and some
  // servers answer a request in time that grows with its whole object). The save planner
  // writes several files per rank there (engine/save_plan.h files_per_rank).
  bool object_store = false;
};

struct ObjectInfo {
  std::string key;
  std::uint64_t size = 0;
  bool operator==(const ObjectInfo&) const = default;
};

struct WriteOptions {
  // commit() / write_atomic() make the object durable before returning (local: fsync file,
  // rename, fsync directory). Cost: one fsync per file and one per directory (more when
  // the page cache holds much dirty data). Turn off only for
  // benchmarks: after a crash a checkpoint may then look complete when it is not.
  bool durable = true;
  // Bypass the page cache where the driver supports it (features().direct_io). Falls back to
  // buffered I/O by itself where the filesystem refuses O_DIRECT (tmpfs). Leave on for large
  // shard files: buffered writes of fresh data are slower and less steady than O_DIRECT.
  bool direct_io = true;
  // Create only: commit() / write_atomic() publish the object only when no object exists
  // under the key at that moment, else throw StorageError kAlreadyExists naming the object
  // and publish nothing (the other object stays). Checked by the service or filesystem in
  // the publishing step itself, so of two writers racing for one key exactly one succeeds
  // (features().conditional_put; other drivers ignore it). A write_atomic() whose answer was
  // lost and whose retry finds an object with exactly its bytes counts as succeeded. This is
  // how the engine commits `.metadata` after removing any previous one (checkpoint.h): a
  // second save racing into the same folder fails instead of both reporting success.
  bool if_absent = false;
};

struct SourceOptions {
  // Map the object into memory when the driver can (features().local_path), so parsers get
  // zero-copy views. Falls back to pread when the driver's mmap limit is reached.
  bool prefer_mmap = true;
  // How far from its start the caller reads the object first (its first needed bytes run
  // from near 0 to about here); 0: not known. An object store opens an object for which
  // this is at most what it reads whole (1 MiB) with one request that also brings these
  // bytes (64 KiB at least; S3, Azure: a ranged GET instead of a HEAD and a GET); otherwise,
  // and with 0, with a HEAD.
  std::uint64_t first_read_bytes = 0;
};

// A streaming write of one object. Nothing is visible under the key until commit()
// returns; destroying the writer without commit() (an exception unwinding, a failed rank)
// deletes the partial object silently and leaves any previous object under the key intact.
//
// As a ByteSink, write() appends and position() counts appended bytes, so torch.save
// writers can stream into it.
class StorageWriter : public ByteSink {
 public:
  ~StorageWriter() override = default;

  // Appends data at position(). Not thread-safe. May block on I/O and on the driver's
  // buffer pool (backpressure). Throws StorageError; UsageError after commit() or after
  // write_at() was used on this writer.
  virtual void append(ByteSpan data, const IoOptions& io = {}) = 0;

  // Appends data as append() does, without copying it where the driver can: the writer may
  // read data until commit() returns, a call of this writer throws, or the writer is
  // destroyed, whichever comes first (the object-store drivers send it from there, a part
  // at a time; the others copy). REQUIRES: data stays valid and unchanged until then.
  // Errors as append(); an error also ends the borrowing (the writer waits for its
  // requests in flight before throwing).
  virtual void append_borrowed(ByteSpan data, const IoOptions& io = {}) { append(data, io); }

  // Writes data at [offset, offset + data.size()). REQUIRES features().parallel_writes
  // (otherwise UsageError). Thread-safe: several threads may call it at once for disjoint
  // ranges; overlapping ranges give unspecified bytes in the overlap. Bytes never written
  // read as zero. The committed size is the highest end offset written. Must not be mixed
  // with append() on one writer (UsageError).
  virtual void write_at(std::uint64_t offset, ByteSpan data, const IoOptions& io = {});

  // Makes the object visible under its key, replacing any previous one (atomically when
  // features().atomic_publish; with WriteOptions::if_absent only when there is none, else
  // StorageError kAlreadyExists), and durable when WriteOptions::durable. REQUIRES: no
  // write_at() in flight. Throws StorageError; on failure nothing new is visible and the
  // partial object is deleted when the writer is destroyed. A second commit() is a UsageError.
  virtual void commit(const IoOptions& io = {}) = 0;

  // The key being written.
  virtual const std::string& key() const = 0;

  // ByteSink: write() == append() and write_borrowed() == append_borrowed(), with default
  // IoOptions.
  void write(ByteSpan data) override { append(data); }
  void write_borrowed(ByteSpan data) override { append_borrowed(data); }
  using ByteSink::write;
};

class Storage {
 public:
  virtual ~Storage() = default;

  // Capabilities of this driver (constant for the lifetime of the Storage).
  virtual StorageFeatures features() const = 0;

  // The URL this storage was opened with, normalized so open_storage(url()) opens the same
  // root ("file:///abs/dir", "memory://name").
  virtual std::string url() const = 0;

  // How errors name an object: `local file "/abs/dir/key"`, `memory object "memory://n/key"`.
  // Does not validate the key.
  virtual std::string describe_key(std::string_view key) const = 0;

  // Size of the object in bytes. Throws StorageError kNotFound when there is no object under
  // key (including a key naming a directory).
  virtual std::uint64_t stat(std::string_view key, const IoOptions& io = {}) = 0;

  // Like stat(), but a missing object returns nullopt instead of throwing.
  virtual std::optional<std::uint64_t> try_stat(std::string_view key, const IoOptions& io = {});

  // The whole (small) object under key, or nullopt when there is none. The default:
  // try_stat(), then read(); an object store asks for the object's first bytes and its size
  // in one request.
  virtual std::optional<std::string> try_read_all(std::string_view key, const IoOptions& io = {});

  // Fills `out` with the bytes at [offset, offset + out.size()) of the object. Throws
  // StorageError kNotFound for a missing object and FormatError naming the object, offset
  // and shortfall when the range extends past the end. Concurrent with a commit to the same
  // key, reads the old or the new object (never a mixture) when atomic_publish.
  virtual void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io = {}) = 0;

  // A ByteSource over the whole object, for parsers (zip, pickle). Local files are mapped
  // (MappedSource) when options.prefer_mmap, read with pread otherwise. The source stays
  // valid (and keeps the bytes it was opened with) after the Storage is destroyed or the
  // object is replaced or removed. Throws StorageError kNotFound for a missing object.
  virtual std::unique_ptr<ByteSource> open_source(std::string_view key, const SourceOptions& options = {},
                                                  const IoOptions& io = {}) = 0;

  // Starts a streaming write of key (see StorageWriter). Creates parent "directories" as
  // needed. Several writers for one key may exist at once; the last to commit wins.
  virtual std::unique_ptr<StorageWriter> open_writer(std::string_view key, const WriteOptions& options = {},
                                                     const IoOptions& io = {}) = 0;

  // Writes a whole (small) object and publishes it in one step: readers and list() see the
  // old object or the new one, never a partial one. This is how `.metadata` and `meta.pt`
  // are published (local: tmp + fsync + rename + directory fsync when durable). Idempotent
  // (with WriteOptions::if_absent: throws StorageError kAlreadyExists when another object
  // is under key, see there).
  virtual void write_atomic(std::string_view key, ByteSpan data, const WriteOptions& options = {},
                            const IoOptions& io = {}) = 0;

  // Objects whose key starts with `prefix` (a plain string prefix: "step=3/" or "__0_"),
  // sorted by key. Temporary files of writers in flight or left by a crash are not listed.
  // An empty prefix lists everything; a prefix matching nothing gives an empty list.
  virtual std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io = {}) = 0;

  // Deletes the object. A missing object is not an error (idempotent).
  virtual void remove(std::string_view key, const IoOptions& io = {}) = 0;

  // Deletes every object whose key starts with prefix, plus leftover temporary files under
  // it, and empty directories the deletion leaves behind (never the root). Returns the
  // number of objects deleted. Idempotent. Not atomic: a concurrent writer may add objects.
  virtual std::size_t remove_prefix(std::string_view prefix, const IoOptions& io = {}) = 0;

  // remove_prefix(""): empties the storage (keeps the root).
  std::size_t remove_all(const IoOptions& io = {}) { return remove_prefix("", io); }

  // The local filesystem path of key when features().local_path; nullopt otherwise. The
  // file may not exist.
  virtual std::optional<std::string> local_path(std::string_view key) const { return std::nullopt; }
};

// Throws UsageError naming the key unless it is a valid key (see the top of this file).
void validate_key(std::string_view key);
// Like validate_key, but the empty prefix and a trailing '/' are allowed, and the last
// segment may be partial ("step=3/__0_").
void validate_prefix(std::string_view prefix);

// The marker in temporary object names (`<name>.sp-tmp.<unique>`); reserved in keys.
inline constexpr std::string_view kTempMarker = ".sp-tmp.";

}  // namespace shardpoint::storage
