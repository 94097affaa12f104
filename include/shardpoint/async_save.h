// async_save(): save() with a short training stall. The caller's thread plans the save
// (save() steps 1-2, numbered in checkpoint.cc; collective) and copies this rank's tensor
// bytes into staging memory, then returns; a background thread writes the files (save()
// step 3: O_DIRECT, checksums); PendingSave::wait() commits (steps 4-6: sidecar, then
// `.metadata` atomically). The checkpoint, its files and its errors are those of save()
// with the same options.
//
//   StagingPool staging(StagingPoolOptions{.max_bytes = 8ull << 30});   // one per rank
//   std::unique_ptr<PendingSave> pending;
//   for (step...) {
//     train_step();                                     // may change the tensors freely
//     if (step % every == 0) {
//       if (pending) pending->wait();                   // commits the previous checkpoint
//       AsyncSaveOptions options;
//       options.staging = &staging;
//       pending = async_save(state, *storage, comm, options);   // returns after the copy
//     }
//   }
//   if (pending) pending->wait();
//
// Stall: planning (a gather and a scatter of plans) plus one memcpy of the bytes this rank
// writes. Staging memory: StagingPool keeps one arena between saves, as large as the
// largest save it staged (the tensor bytes of the items this rank writes, each rounded up
// to a small alignment), so a training loop allocates (and page-faults) it once; reserve() does
// that before the first save. Only the items this rank writes are copied: a replicated
// tensor that the plan gives to another rank costs this rank nothing.
//
// Collectives: async_save() and wait() are collective (every rank calls them at the same
// point of its sequence of collectives). The background thread never touches the
// communicator, so the trainer may run its own collectives while the files are written.
// An async_save() on a StagingPool whose previous save was not waited for first calls
// that save's wait() (so a new save always starts after the previous one committed) and
// throws its error, if any, without starting the new save.
//
// Thread-safety: a PendingSave is used from one thread. The storage and the communicator
// must outlive the PendingSave; the StagingPool must outlive every PendingSave it staged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "shardpoint/checkpoint.h"
#include "shardpoint/communicator.h"
#include "shardpoint/mutex.h"
#include "shardpoint/state_dict.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

class AsyncSaveJob;  // async_save.cc

struct StagingPoolOptions {
  // Upper bound on the staging memory of one rank. An async_save() whose rank holds more
  // tensor bytes than this (counted before deduplication of replicated tensors) fails on
  // every rank with UsageError before anything is written. 0: no bound.
  std::uint64_t max_bytes = 0;
  // madvise(MADV_HUGEPAGE) on the arena. Off by default: the first touch of huge pages can
  // be several times slower (compaction), which lengthens the first save's stall, while
  // later copies run at the same speed either way (first staging of 44 MB: ~0.6 s with
  // huge pages, ~0.15 s on 4 KiB pages).
  bool huge_pages = false;
};

// Staging memory for async saves of one rank, kept between saves. Thread-safe.
class StagingPool {
 public:
  explicit StagingPool(StagingPoolOptions options = {});
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // Allocates (and touches) an arena of at least `bytes` now, so the first save does not
  // pay for fresh memory. Throws UsageError above max_bytes, std::bad_alloc.
  void reserve(std::uint64_t bytes);
  // Bytes of memory the pool holds now (its arena).
  std::uint64_t held_bytes() const;
  const StagingPoolOptions& options() const { return options_; }

 private:
  friend class AsyncSaveJob;  // leases the arena, records the save in flight
  // Grows the arena to at least `bytes` (without touching it) and marks it leased. Throws
  // UsageError when a save staged here is still writing.
  std::span<std::byte> lease_arena(std::uint64_t bytes);
  void return_arena() noexcept;
  void grow_locked(std::uint64_t bytes) SP_REQUIRES(mu_);

  StagingPoolOptions options_;
  mutable Mutex mu_;
  std::byte* arena_ SP_GUARDED_BY(mu_) = nullptr;
  std::uint64_t arena_bytes_ SP_GUARDED_BY(mu_) = 0;
  bool leased_ SP_GUARDED_BY(mu_) = false;
  std::weak_ptr<AsyncSaveJob> in_flight_ SP_GUARDED_BY(mu_);  // the last save staged here, until waited for
};

struct AsyncSaveOptions {
  // Everything save() takes; the files, checksums and sidecar are the same.
  SaveOptions save;
  // Where this rank's bytes are staged. nullptr: a private pool, freed with the
  // PendingSave (every save then allocates its staging memory afresh).
  StagingPool* staging = nullptr;
  // Threads copying into staging memory (the caller's included). REQUIRES >= 1.
  int copy_thread_count = 1;
};

struct AsyncSaveReport {
  double stall_seconds = 0;        // async_save() from call to return
  double plan_seconds = 0;         // steps 1-2 (part of the stall)
  double copy_seconds = 0;         // staging copy (part of the stall)
  std::uint64_t staged_bytes = 0;  // tensor bytes copied into staging memory
};

// A save whose files are being written in the background.
class PendingSave {
 public:
  explicit PendingSave(std::shared_ptr<AsyncSaveJob> job);
  // When wait() was never called: joins the writer and removes this rank's files of this
  // save (nothing is committed; other ranks' wait(), if they call it, will fail).
  ~PendingSave();
  PendingSave(const PendingSave&) = delete;
  PendingSave& operator=(const PendingSave&) = delete;

  // (collective) Waits for this rank's writes, agrees on success with the other ranks
  // and commits as save() does; returns save()'s report (write_seconds: the background
  // writes; commit_seconds: this call after the writes finished). Throws save()'s errors on
  // every rank; then nothing is committed and each rank's files are removed. Calling it
  // again returns (or throws) the same outcome without communicating.
  SaveReport wait();
  // True once this rank's background writes have finished (not yet committed). No
  // communication; for progress display or to decide when to call wait().
  bool writes_done() const;
  const AsyncSaveReport& report() const;

 private:
  std::shared_ptr<AsyncSaveJob> job_;
};

// Starts a save of `state` into `checkpoint` (collective; see the header comment). Returns
// once this rank's bytes are staged: the caller may change or free its tensors then.
// Throws save()'s planning errors (UsageError, PlanError, CommError) on every rank; write
// and commit errors come from PendingSave::wait().
std::unique_ptr<PendingSave> async_save(const StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm,
                                        const AsyncSaveOptions& options = {});

}  // namespace shardpoint::engine
