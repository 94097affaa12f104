// Building blocks the object-store drivers share for reads: splitting a large read into
// parallel ranged requests, and the two ByteSources of open_source() (an object fetched
// whole, and a lazily read object with a small cache of read-ahead windows).
//
// Drivers supply one function that fetches a byte range of one object into a caller buffer
// (a ranged GET, signed and retried by the driver); nothing here does HTTP itself.
//
// Thread-safety: read_in_parallel() runs its callback on several threads at once; the
// sources are safe to read from any number of threads (ByteSource's contract), and a
// WindowedSource that fetches ahead calls `fetch` from threads of its own as well. A
// ReadAheadBudget is thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/byte_stream.h"
#include "shardpoint/mutex.h"

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

class WindowedSource;

// One memory budget for the blocks of several WindowedSources (a storage's open sources: a
// load on gs:// reads 4 objects per rank at once), so that their blocks together stay
// within about one budget instead of one per source. A source that needs room drops its own
// blocks first, as it does alone, then those of the other sources: for a fetch ahead or a
// miss, blocks read through (least recently used first, per source); for a miss also
// blocks not read yet (furthest into their object first). Blocks being fetched are never
// dropped. Other sources are only tried (try_lock), never waited for, so there is no lock
// order between sources; one busy at that instant keeps its blocks.
// Slack, as for one source: a fetch ahead never goes beyond the budget, while a miss fetches
// its block even when not enough could be dropped (every other block being fetched, or its
// source busy), so each thread that misses may add one block beyond it.
// Thread-safety: every method is thread-safe. Sources keep their budget alive (shared_ptr).
class ReadAheadBudget {
 public:
  explicit ReadAheadBudget(std::uint64_t bytes) : capacity_(bytes) {}
  ReadAheadBudget(const ReadAheadBudget&) = delete;
  ReadAheadBudget& operator=(const ReadAheadBudget&) = delete;

  std::uint64_t capacity() const { return capacity_; }
  // Bytes of the blocks its sources cache or fetch now.
  std::uint64_t used() const { return used_.load(); }
  // The most used() has been. For tests and metrics.
  std::uint64_t peak() const { return peak_.load(); }

 private:
  friend class WindowedSource;
  // Adds bytes when used() + bytes fits the capacity (fetches ahead); returns whether it did.
  bool try_charge(std::uint64_t bytes);
  // Adds bytes, fitting or not (misses).
  void charge(std::uint64_t bytes);
  void release(std::uint64_t bytes);
  // Raises peak() to used when it is higher.
  void note_used(std::uint64_t used);
  void add_source(const WindowedSource* source);
  // Blocks until no reclaim() is dropping blocks of source.
  void remove_source(const WindowedSource* source);
  // Has the sources other than `asking` drop blocks until `bytes` more fit (see the top:
  // those read through, and with unread_too those not read yet). REQUIRES: the caller holds
  // no source's lock but asking's.
  void reclaim(const WindowedSource* asking, std::uint64_t bytes, bool unread_too);

  const std::uint64_t capacity_;
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint64_t> peak_{0};
  Mutex mu_;  // held while reclaim() calls into sources
  std::vector<const WindowedSource*> sources_ SP_GUARDED_BY(mu_);
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
// Fetching ahead (`ahead` > 0): at every read, and whenever a fetch ends, the source also
// starts fetching the lowest announced bytes no block holds, as blocks sized as above, with
// at most `ahead` such fetches at once, on threads of its own (at most `ahead`, started at
// its first fetch ahead). A reader that needs bytes of a block being fetched ahead waits
// for it. A failed fetch ahead is not cached, its ranges stay announced, and fetching ahead
// pauses until a reader's own fetch started after it succeeds; its error reaches only a
// reader waiting on that block, which then fetches the bytes itself (and throws that
// fetch's error). When no thread or memory can be had for it, fetching ahead is skipped,
// never a read failed.
// Memory: blocks cached or being fetched hold at most windows x window_bytes, at most
// kMaxBlocks of them, so small ones do not evict each other; with a ReadAheadBudget, the
// blocks of all its sources together also stay within it (see there). When a block does not fit, the
// least recently used blocks whose announced bytes have all been read are dropped. A fetch
// ahead that still does not fit waits for a later read; a miss instead drops blocks not read
// through yet too (the furthest into the object first), and fetches its block even when all
// the rest is being fetched, so a thread that misses then adds one block beyond the budget.
// Blocks being fetched are never dropped, and a reader copying out of a dropped block keeps
// it until its copy ends. Plus the announced ranges (merged; at most kMaxHints of them,
// ~64 B each, the lowest dropped first), and per cached block the byte ranges read from it
// and those announced and not read yet (~64 B each; adjacent reads merge, so there are
// about as many as items whose reads leave a gap before the next).
// `fetch` must fail when the object changed since open (drivers pin the version), and must
// be safe to call from several threads at once.
class WindowedSource final : public ByteSource {
 public:
  static constexpr std::size_t kMaxHints = 1 << 16;
  static constexpr std::size_t kMaxBlocks = 256;
  static constexpr std::size_t kMinWindowBytes = 4096;

  // The bytes a source of these settings caches at most (windows x window_bytes, each as the
  // constructor clamps it): its own budget, and what a ReadAheadBudget shared by such
  // sources is sized to.
  static std::uint64_t cache_bytes(std::size_t window_bytes, int windows);

  // ahead: fetches ahead at once (0: none; at most windows - 1 is used). budget: shared
  // with other sources (nullptr: this source's windows x window_bytes only).
  WindowedSource(std::string name, std::uint64_t size, std::size_t window_bytes, int windows, RangeFetch fetch,
                 int ahead = 0, std::shared_ptr<ReadAheadBudget> budget = nullptr);
  // Drops the fetches ahead not started yet and waits for those in flight (at most `ahead`
  // GETs of at most window_bytes; a GET cannot be interrupted). REQUIRES: no read or
  // will_need running.
  ~WindowedSource() override;
  WindowedSource(const WindowedSource&) = delete;
  WindowedSource& operator=(const WindowedSource&) = delete;

  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return size_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override;
  // Records [offset, offset + length) as a range the reader will read (sizes blocks, keeps
  // the cached blocks holding it; fetches nothing now: fetching ahead starts at the next
  // read).
  void will_need(std::uint64_t offset, std::uint64_t length) const override;
  // Caches bytes [0, length) of the object, fetched already (by the request that opened it,
  // of the version `fetch` pins) and held by `bytes`, as a block, when this source's and the
  // shared budget have room for it (making it as a fetch ahead does); else drops them.
  // Nothing when length is 0 or above size(). REQUIRES: no read or will_need yet.
  void adopt_first_block(std::shared_ptr<const std::byte[]> bytes, std::uint64_t length);
  // Bytes of the blocks cached or being fetched now (see Memory above). For tests and metrics.
  std::uint64_t cached_bytes() const;

 private:
  friend class ReadAheadBudget;
  using Bytes = std::shared_ptr<const std::byte[]>;
  using Ranges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;  // [start, end)
  using RangeSet = std::map<std::uint64_t, std::uint64_t>;              // start -> end, disjoint
  struct Block {
    std::uint64_t start = 0;
    std::uint64_t length = 0;
    std::uint64_t id = 0;             // tells this fetch from a later one of the same range
    bool fetching = true;             // its fetch is in flight (never dropped then)
    bool fetched_ahead = false;       // by fetch_ahead(), not by a reader's miss
    RangeSet unread;                  // announced bytes in it that no read has taken yet
    RangeSet read;                    // bytes reads have taken from it
    std::shared_future<Bytes> bytes;  // ready, or being fetched by another thread

    // A read took [offset, offset + n) from it.
    void take(std::uint64_t offset, std::uint64_t n);
  };
  // A block's bytes; start and length as in Block.
  struct Piece {
    Bytes bytes;
    std::uint64_t start = 0;
    std::uint64_t length = 0;
  };
  // A block fetch_ahead() queued for its threads (its Block has the same id).
  struct Job {
    std::uint64_t id = 0;
    std::uint64_t start = 0;
    std::uint64_t length = 0;
    Ranges announced;  // what forget_hints() dropped for it, announced again if it fails
    std::promise<Bytes> promise;
  };

  // A block holding the byte at offset, cached or fetched now (a read of `length` bytes
  // from offset missed). Throws the fetch's error.
  Piece block_for(std::uint64_t offset, std::uint64_t length) const;
  // Fetches the bytes of block `id` ([start, start + length)) and completes promise with
  // them or the error; a failed block leaves the cache and `announced` is announced again.
  // Never throws.
  void fill(std::uint64_t id, std::uint64_t start, std::uint64_t length, bool fetched_ahead, const Ranges& announced,
            std::promise<Bytes>& promise) const;
  // The cached block holding offset, or cache_.end().
  std::list<Block>::iterator find_block(std::uint64_t offset) const SP_REQUIRES(mu_);
  // REQUIRES: no cached block holds offset. The range a miss fetches.
  std::pair<std::uint64_t, std::uint64_t> block_range(std::uint64_t offset, std::uint64_t length) const
      SP_REQUIRES(mu_);
  // Drops [begin, end) from the announced ranges (being fetched now: a later block does not
  // stretch over them again); returns what it dropped.
  Ranges forget_hints(std::uint64_t begin, std::uint64_t end) const SP_REQUIRES(mu_);
  // Merges [begin, end) into the announced ranges.
  void announce(std::uint64_t begin, std::uint64_t end) const SP_REQUIRES(mu_);
  // Drops blocks until one of `length` more bytes fits the budget (see Memory at the top:
  // for_miss chooses the miss's rules over the fetch ahead's); a fetch ahead drops nothing
  // when it cannot fit. Returns whether it fits.
  bool make_room(std::uint64_t length, bool for_miss) const SP_REQUIRES(mu_);
  // Takes a block out of the cache, releasing its bytes: one fetched, or one whose fetch
  // failed (a block a fetch will still fill must stay).
  std::list<Block>::iterator drop(std::list<Block>::iterator it) const SP_REQUIRES(mu_);
  // Drops blocks read through, least recently used first, until done() or none is left.
  template <typename Done>
  void drop_read_through(const Done& done) const SP_REQUIRES(mu_);
  // Drops the cached block furthest into the object (not one being fetched); false when
  // there is none.
  bool drop_furthest() const SP_REQUIRES(mu_);
  // For ReadAheadBudget::reclaim(): unless another thread holds mu_, drops blocks read
  // through (then with unread_too, the furthest not read yet) until `bytes` are dropped.
  void shed(std::uint64_t bytes, bool unread_too) const noexcept;
  // Queues fetches ahead (see the top).
  void fetch_ahead() const noexcept SP_REQUIRES(mu_);
  // A fetch-ahead thread: runs queued jobs until stopped.
  void run_jobs(const std::stop_token& stop) const;

  std::string name_;
  std::uint64_t size_;
  std::size_t window_bytes_;
  int windows_;
  int ahead_;
  RangeFetch fetch_;
  std::shared_ptr<ReadAheadBudget> budget_;  // nullptr: none shared
  mutable Mutex mu_;
  mutable std::list<Block> cache_ SP_GUARDED_BY(mu_);  // most recently used first
  mutable std::uint64_t next_id_ SP_GUARDED_BY(mu_) = 0;
  mutable std::uint64_t cached_bytes_ SP_GUARDED_BY(mu_) = 0;  // lengths of cache_'s blocks
  // Announced [start, end), disjoint.
  mutable std::map<std::uint64_t, std::uint64_t> hints_ SP_GUARDED_BY(mu_);
  mutable std::deque<Job> jobs_ SP_GUARDED_BY(mu_);  // fetches ahead not started
  mutable int ahead_jobs_ SP_GUARDED_BY(mu_) = 0;    // fetches ahead queued or running
  // A fetch ahead failed, and since then no miss from ahead_paused_until_ on succeeded.
  mutable bool ahead_paused_ SP_GUARDED_BY(mu_) = false;
  mutable std::uint64_t ahead_paused_until_ SP_GUARDED_BY(mu_) = 0;
  mutable int idle_threads_ SP_GUARDED_BY(mu_) = 0;  // threads waiting for a job
  mutable bool closing_ SP_GUARDED_BY(mu_) = false;  // set by the destructor
  mutable CondVar job_queued_;
  mutable std::vector<std::jthread> threads_ SP_GUARDED_BY(mu_);  // joined by the destructor
};

}  // namespace shardpoint::storage::http
