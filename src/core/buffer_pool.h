// A bounded pool of equally sized, O_DIRECT-aligned staging buffers.
//
// Writers take a buffer (a Lease) only when they are about to move bytes and give it back
// when done; the pool never holds more than `capacity_bytes`. When every buffer is leased,
// acquire() waits (backpressure) until a lease is returned, the deadline passes or the stop
// token fires. It never falls back to malloc: memory stays bounded however many writers run.
//
// Buffers are allocated lazily (the first acquire that finds no free buffer, while the
// pool is below capacity) and then kept until the pool is destroyed, because the first
// touch of fresh anonymous memory is far slower than writing to reused memory (1-3 GB/s
// against ~20 GB/s). Buffers of 2 MiB or more are 2 MiB aligned and
// madvise(MADV_HUGEPAGE)d.
//
// Thread-safety: all methods are thread-safe. A Lease is move-only and must be returned
// (destroyed) before the pool is destroyed (REQUIRES; checked with assert in debug builds).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <stop_token>
#include <vector>

#include "shardpoint/mutex.h"

namespace shardpoint {

struct BufferPoolOptions {
  // Bytes per buffer, rounded up to `alignment`. One buffer is one O_DIRECT write: 8 MiB
  // reaches the disk ceiling with synchronous pwrite; smaller buffers add syscalls.
  std::size_t buffer_bytes = std::size_t{8} << 20;
  // Upper bound on memory held by the pool (buffer count = capacity / buffer_bytes, at
  // least 1). Lower it when the trainer needs the host RAM; writers then wait longer.
  std::size_t capacity_bytes = std::size_t{128} << 20;
  // Alignment of every buffer's address and size. 4096 satisfies O_DIRECT on every
  // device we have seen (logical block size <= 4096).
  std::size_t alignment = 4096;
  // madvise(MADV_HUGEPAGE) on buffers of >= 2 MiB (needed where THP runs in madvise mode).
  bool huge_pages = true;
};

class BufferPool {
 public:
  using Clock = std::chrono::steady_clock;

  // A leased buffer. Move-only; returns the buffer to the pool on destruction or release().
  class Lease {
   public:
    Lease() = default;
    ~Lease() { release(); }
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    // The whole buffer (pool.buffer_bytes() bytes, aligned to pool alignment). Contents are
    // whatever the previous holder left there. Empty for a default-constructed lease.
    std::span<std::byte> bytes() const { return {data_, size_}; }
    std::byte* data() const { return data_; }
    std::size_t size() const { return size_; }
    explicit operator bool() const { return data_ != nullptr; }
    // Gives the buffer back now (idempotent).
    void release() noexcept;

   private:
    friend class BufferPool;
    Lease(BufferPool* pool, std::byte* data, std::size_t size) : pool_(pool), data_(data), size_(size) {}
    BufferPool* pool_ = nullptr;
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
  };

  // Throws UsageError when alignment is not a power of two or buffer_bytes is 0.
  explicit BufferPool(const BufferPoolOptions& options = {});
  // REQUIRES: no lease outstanding. Frees every buffer.
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Returns a buffer, waiting while all are leased. Blocks; wakes when a lease is returned.
  // Throws StorageError kTransient ("buffer pool: no buffer free after N ms ...") when the
  // deadline passes, StorageError kOther ("... cancelled") when `stop` is requested, and
  // std::bad_alloc when a new buffer cannot be allocated.
  Lease acquire(Clock::time_point deadline = Clock::time_point::max(), std::stop_token stop = {});
  // Returns a buffer if one is free (or can be allocated) right now; nullopt otherwise.
  std::optional<Lease> try_acquire();

  // Allocates buffers up to `count` (at most max_buffers()) and touches every page, so the
  // first-touch cost is paid now (at startup) rather than in the first save. Blocks while
  // it writes; safe to call while leases are out. Returns the buffers allocated in total.
  std::size_t prefault(std::size_t count);

  std::size_t buffer_bytes() const { return buffer_bytes_; }
  std::size_t alignment() const { return alignment_; }
  // Most buffers that can exist at once.
  std::size_t max_buffers() const { return max_buffers_; }
  // Buffers allocated so far (never shrinks).
  std::size_t allocated_buffers() const;
  // Buffers currently leased.
  std::size_t leased_buffers() const;

 private:
  std::byte* take_locked() SP_REQUIRES(mu_);      // nullptr when all are leased
  std::byte* allocate_locked() SP_REQUIRES(mu_);  // a new buffer, recorded in all_
  void give_back(std::byte* data) noexcept;

  const std::size_t buffer_bytes_;
  const std::size_t alignment_;
  const std::size_t max_buffers_;
  const bool huge_pages_;

  mutable Mutex mu_;
  CondVar returned_;
  std::vector<std::byte*> all_ SP_GUARDED_BY(mu_);   // every allocated buffer
  std::vector<std::byte*> free_ SP_GUARDED_BY(mu_);  // buffers not leased
};

}  // namespace shardpoint
