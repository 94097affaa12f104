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

// A large object read lazily. Reads smaller than a window are served from an LRU cache of
// `windows` aligned windows of window_bytes (parsers read headers and small items in
// order, so one window serves many reads; each fetch costs a round trip); larger reads go
// straight into the caller's buffer. Memory: windows x window_bytes. `fetch` must fail
// when the object changed since open (drivers pin the version: ETag, generation).
class WindowedSource final : public ByteSource {
 public:
  WindowedSource(std::string name, std::uint64_t size, std::size_t window_bytes, int windows, RangeFetch fetch);
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return size_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override;

 private:
  std::shared_ptr<const std::string> window(std::uint64_t start, std::uint64_t length) const;

  std::string name_;
  std::uint64_t size_;
  std::size_t window_bytes_;
  int windows_;
  RangeFetch fetch_;
  mutable std::mutex mu_;
  mutable std::list<std::pair<std::uint64_t, std::shared_ptr<const std::string>>> cache_;  // GUARDED_BY(mu_)
};

}  // namespace shardpoint::storage::http
