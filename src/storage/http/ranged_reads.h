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
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>

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

// A large object read lazily, for parsers and the engine's streaming reads, through a small
// cache of blocks (ranged GETs). A read takes what cached blocks hold of it and fetches the
// rest one block at a time; every GET costs a round trip, so blocks are large, and they tile
// the object instead of overlapping (a block ends where a cached one starts, a read that
// crosses a block's end fetches only the bytes after it).
// How large a block is depends on what the reader announced and has not been fetched yet
// (ByteSource::will_need; the engine announces every byte range a load will read, about
// 64 MiB ahead):
//  - inside an announced range: from where that range's unfetched bytes start (at most
//    window_bytes / 4 before the read: a reader thread behind this one reads them next)
//    over the announced ranges that follow with gaps below window_bytes / 8, up to
//    window_bytes. A lone small item (a replicated `step` in another rank's file) is one
//    small GET, not a window of bytes nobody needs; a run of items is window_bytes per GET.
//  - unannounced: window_bytes from where the read starts (a read smaller than the
//    lookbehind, min(64 KiB, window / 4), from that much before it), so the reads a parser
//    makes in order (a zip's end records, then its central directory just before them)
//    mostly land in one block.
// The remaining part of a read of a window or more goes straight into the caller's buffer
// (drivers split large ones into parallel ranged GETs). Threads that miss on the same block
// wait for one fetch instead of each fetching it.
// Memory: cached blocks of windows x window_bytes in all (least recently used dropped
// first; at most kMaxBlocks blocks, so small ones do not evict each other), plus the
// announced ranges (merged; at most kMaxHints of them, ~64 B each, the lowest dropped first).
// `fetch` must fail when the object changed since open (drivers pin the version).
class WindowedSource final : public ByteSource {
 public:
  static constexpr std::size_t kMaxHints = 1 << 16;
  static constexpr std::size_t kMaxBlocks = 256;

  WindowedSource(std::string name, std::uint64_t size, std::size_t window_bytes, int windows, RangeFetch fetch);
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return size_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override;
  // Records [offset, offset + length) as a range the reader will read (sizes blocks; fetches
  // nothing now).
  void will_need(std::uint64_t offset, std::uint64_t length) const override;

 private:
  using Bytes = std::shared_ptr<const std::string>;
  struct Block {
    std::uint64_t start = 0;
    std::uint64_t length = 0;
    std::uint64_t id = 0;             // tells this fetch from a later one of the same range
    std::shared_future<Bytes> bytes;  // ready, or being fetched by another thread
  };
  // A block holding the byte at offset, cached or fetched now (a read of `length` bytes
  // from offset missed); *start: where it starts.
  Bytes block_for(std::uint64_t offset, std::uint64_t length, std::uint64_t* start) const;
  // REQUIRES: mu_ held, no cached block holds offset. The range a miss fetches.
  std::pair<std::uint64_t, std::uint64_t> block_range(std::uint64_t offset, std::uint64_t length) const;
  // REQUIRES: mu_ held. Drops [begin, end) from the announced ranges (being fetched now: a
  // later block does not stretch over them again).
  void forget_hints(std::uint64_t begin, std::uint64_t end) const;

  std::string name_;
  std::uint64_t size_;
  std::size_t window_bytes_;
  int windows_;
  RangeFetch fetch_;
  mutable std::mutex mu_;
  mutable std::list<Block> cache_;  // GUARDED_BY(mu_), most recently used first
  mutable std::uint64_t next_id_ = 0;  // GUARDED_BY(mu_)
  mutable std::uint64_t cached_bytes_ = 0;                // GUARDED_BY(mu_): lengths of cache_'s blocks
  mutable std::map<std::uint64_t, std::uint64_t> hints_;  // GUARDED_BY(mu_): announced [start, end), disjoint
};

}  // namespace shardpoint::storage::http
