// Building blocks the object-store drivers share for reads: splitting a large read into
// parallel ranged requests, and the two ByteSources of open_source() (an object fetched
// whole, and a lazily read object with a small cache of read-ahead windows).
//
// Drivers supply one function that fetches a byte range of one object into a caller buffer
// (a ranged GET, signed and retried by the driver); nothing here does HTTP itself.
//
// Thread-safety: read_in_parallel() runs its callback on several threads at once; the
// sources are safe to read from any number of threads (ByteSource's contract).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "core/byte_stream.h"

namespace shardpoint::storage::http {

// Fetches the bytes at [offset, offset + out.size()) of one object into out.
using RangeFetch = std::function<void(std::uint64_t offset, std::span<std::byte> out)>;

// Calls fn(0) .. fn(count - 1) on at most `threads` threads (each index once). The first
// error stops the others at their next index and is rethrown. For request fan-out (parallel
// ranged GETs, deletes of a listing).
void for_each_in_parallel(std::size_t count, int threads, const std::function<void(std::size_t)>& fn);

// Fills out (the object's bytes from `offset`) with fetches of at most chunk_bytes, at most
// `threads` at once. A read below parallel_bytes (or threads <= 1) is one fetch. The first
// error stops the other threads at their next chunk and is rethrown.
void read_in_parallel(std::uint64_t offset, std::span<std::byte> out, std::size_t parallel_bytes,
                      std::size_t chunk_bytes, int threads, const RangeFetch& fetch);

// An object read whole at open: keeps its bytes after the object is replaced or removed.
class WholeObjectSource final : public ByteSource {
 public:
  WholeObjectSource(std::string bytes, std::string name);
  const std::string& name() const override { return source_.name(); }
  std::uint64_t size() const override { return source_.size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override;
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override;

 private:
  std::string bytes_;
  MemorySource source_;
};

// A large object read lazily, for parsers and the engine's streaming reads. A read that
// misses the cache fetches one block of window_bytes from where it starts (a read smaller
// than the lookbehind, min(64 KiB, window / 4), from that much before it), so the reads a .distcp load makes in order (an
// item's zip end records, then its central directory just before them, the next item's
// headers, its data in pieces smaller than a window) mostly land in one block. Every GET
// costs a round trip (and moto copies the whole object per GET), so blocks are large.
// Reads of a window or more go straight into the caller's buffer. Threads that miss on the
// same block wait for one fetch instead of each fetching it. Memory: windows x window_bytes.
// `fetch` must fail when the object changed since open (drivers pin the version).
class WindowedSource final : public ByteSource {
 public:
  WindowedSource(std::string name, std::uint64_t size, std::size_t window_bytes, int windows, RangeFetch fetch);
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return size_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override;

 private:
  using Bytes = std::shared_ptr<const std::string>;
  struct Block {
    std::uint64_t start = 0;
    std::uint64_t length = 0;
    std::uint64_t id = 0;             // tells this fetch from a later one of the same range
    std::shared_future<Bytes> bytes;  // ready, or being fetched by another thread
  };
  Bytes block_for(std::uint64_t offset, std::size_t length, std::uint64_t* start) const;

  std::string name_;
  std::uint64_t size_;
  std::size_t window_bytes_;
  int windows_;
  RangeFetch fetch_;
  mutable std::mutex mu_;
  mutable std::list<Block> cache_;  // GUARDED_BY(mu_), most recently used first
  mutable std::uint64_t next_id_ = 0;  // GUARDED_BY(mu_)
};

}  // namespace shardpoint::storage::http
