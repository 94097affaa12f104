// async_save(): save()'s steps (save_steps.h) with step 3 on a background thread over
// staged copies of this rank's tensors.
#include "shardpoint/async_save.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "core/byte_io.h"
#include "engine/parallel_for.h"
#include "engine/save_steps.h"
#include "pickle/reader.h"
#include "pickle/writer.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr std::uint64_t kHugePage = std::uint64_t{2} << 20;
// Staged tensors start on cache-line boundaries (the writer's copies and checksums run
// over whole lines; no false sharing between the copy threads).
constexpr std::uint64_t kStageAlignment = 64;
// Copies are cut into slices of this size so the copy threads share big tensors.
constexpr std::size_t kCopySliceBytes = std::size_t{8} << 20;

std::uint64_t round_up(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

// One memcpy of the staging copy.
struct CopySlice {
  const std::byte* from;
  std::byte* to;
  std::size_t bytes;
};

void copy_slices(const std::vector<CopySlice>& slices, int threads) {
  parallel_for(slices.size(), static_cast<std::size_t>(std::max(threads, 1)),
               [&](std::size_t i) { std::memcpy(slices[i].to, slices[i].from, slices[i].bytes); });
}

// An independent copy of an object leaf (the caller may change the original's tree after
// async_save() returns): its pickle read back.
pickle::ValuePtr snapshot_object(const pickle::ValuePtr& value, const std::string& fqn) {
  if (!value) return value;
  const std::string bytes = pickle::pickle_to_string(*value);
  return pickle::read_pickle(as_bytes(bytes), "async_save: object \"" + fqn + "\"");
}

std::uint64_t tensor_bytes(const FlatStateDict& flat) {
  std::uint64_t n = 0;
  for (const auto& [fqn, value] : flat.items) {
    if (const auto* t = std::get_if<TensorShard>(&value)) n += t->data.size();
  }
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// StagingPool

StagingPool::StagingPool(StagingPoolOptions options) : options_(options) {}

StagingPool::~StagingPool() { std::free(arena_); }

void StagingPool::grow_locked(std::uint64_t bytes) {
  if (bytes <= arena_bytes_) return;
  const std::uint64_t size = round_up(bytes, kHugePage);
  std::free(arena_);
  arena_ = nullptr;
  arena_bytes_ = 0;
  void* p = nullptr;
  if (::posix_memalign(&p, kHugePage, size) != 0) throw std::bad_alloc();
  // Advisory: without transparent huge pages the arena runs on 4 KiB pages.
  if (options_.huge_pages) (void)::madvise(p, size, MADV_HUGEPAGE);
  arena_ = static_cast<std::byte*>(p);
  arena_bytes_ = size;
}

void StagingPool::reserve(std::uint64_t bytes) {
  if (options_.max_bytes != 0 && bytes > options_.max_bytes) {
    throw UsageError("StagingPool::reserve: " + std::to_string(bytes) + " bytes is more than max_bytes (" +
                     std::to_string(options_.max_bytes) + ")");
  }
  MutexLock lock(mu_);
  if (leased_) throw UsageError("StagingPool::reserve: a save staged in this pool is still writing");
  const std::uint64_t before = arena_bytes_;
  grow_locked(bytes);
  // First touch of fresh memory is several times slower than a copy into touched memory:
  // pay it here, not in the first save's stall.
  if (arena_bytes_ != before) std::memset(arena_, 0, static_cast<std::size_t>(arena_bytes_));
}

std::uint64_t StagingPool::held_bytes() const {
  MutexLock lock(mu_);
  return arena_bytes_;
}

std::span<std::byte> StagingPool::lease_arena(std::uint64_t bytes) {
  MutexLock lock(mu_);
  if (leased_) throw UsageError("async_save: the staging pool is in use by a save that is still writing");
  grow_locked(bytes);
  leased_ = true;
  return {arena_, static_cast<std::size_t>(arena_bytes_)};
}

void StagingPool::return_arena() noexcept {
  MutexLock lock(mu_);
  leased_ = false;
}

// ---------------------------------------------------------------------------------------
// AsyncSaveJob: one async save on one rank.

class AsyncSaveJob {
 public:
  AsyncSaveJob(storage::Storage& st, comm::Communicator& comm, const AsyncSaveOptions& options)
      : st_(st), comm_(comm), options_(options.save), copy_threads_(options.copy_thread_count) {
    if (options.staging == nullptr) own_pool_ = std::make_unique<StagingPool>();
    pool_ = options.staging != nullptr ? options.staging : own_pool_.get();
  }

  ~AsyncSaveJob() {
    join_writer();
    if (!waited_) committed_.remove_all(st_);
  }

  StagingPool& pool() { return *pool_; }

  // Steps 1-2, the staging copy, and the start of step 3.
  void start(const StateNode& state) {
    const auto t0 = Clock::now();
    const std::uint64_t max_bytes = pool_->options().max_bytes;
    const int copy_threads = copy_threads_;
    planned_ = save_steps::plan_save(state, st_, comm_, options_, [&](const FlatStateDict& flat) {
      if (copy_threads < 1) {
        throw UsageError("async_save: copy_thread_count must be >= 1, found " + std::to_string(copy_threads));
      }
      const std::uint64_t need = tensor_bytes(flat);
      if (max_bytes != 0 && need > max_bytes) {
        throw UsageError("async_save: rank " + std::to_string(comm_.rank()) + " holds " + std::to_string(need) +
                         " tensor bytes, more than the staging pool's max_bytes (" + std::to_string(max_bytes) + ")");
      }
    });
    report_.files = planned_.plan.files;
    report_.plan_seconds = async_report_.plan_seconds = seconds_since(t0);

    const auto t_copy = Clock::now();
    try {
      stage();
    } catch (...) {
      // Reported by wait() on every rank, as a failed write would be.
      result_ = save_steps::failed_write_result(std::current_exception());
      writes_done_.store(true);
    }
    async_report_.copy_seconds = seconds_since(t_copy);
    if (!writes_done_.load()) {
      writer_ = std::jthread([this] { write(); });
    }
    async_report_.stall_seconds = seconds_since(t0);
  }

  SaveReport wait() {
    if (waited_) {
      if (outcome_) std::rethrow_exception(outcome_);
      return report_;
    }
    waited_ = true;
    join_writer();
    const auto t_commit = Clock::now();
    try {
      save_steps::commit_save(std::move(result_), std::move(planned_.metadata), st_, comm_, options_, committed_);
    } catch (...) {
      outcome_ = std::current_exception();
      throw;
    }
    report_.commit_seconds = seconds_since(t_commit);
    return report_;
  }

  // The save last staged in `pool`, while its PendingSave exists.
  static std::shared_ptr<AsyncSaveJob> in_flight(StagingPool& pool) {
    MutexLock lock(pool.mu_);
    return pool.in_flight_.lock();
  }
  static void set_in_flight(StagingPool& pool, const std::shared_ptr<AsyncSaveJob>& job) {
    MutexLock lock(pool.mu_);
    pool.in_flight_ = job;
  }

  bool waited() const { return waited_; }
  bool writes_done() const { return writes_done_.load(); }
  const AsyncSaveReport& async_report() const { return async_report_; }

 private:
  // Copies the tensor bytes of every item this rank writes into the pool's arena and
  // points the staged state at the copies; object leaves are snapshot.
  void stage() {
    std::uint64_t need = 0;
    for (const WriteItem& item : planned_.plan.items) {
      if (item.type == WriteItemType::kTensor) need += round_up(item.nbytes, kStageAlignment);
    }
    const std::span<std::byte> arena = pool_->lease_arena(need);
    leased_ = true;
    std::vector<CopySlice> slices;
    std::uint64_t offset = 0;
    for (const WriteItem& item : planned_.plan.items) {
      auto it = planned_.flat.items.find(item.index.fqn);
      if (it == planned_.flat.items.end()) continue;  // write_item reports it
      FlatValue value = it->second;
      if (auto* shard = std::get_if<TensorShard>(&value)) {
        // A shard whose size does not match the plan stays as it is: write_item rejects it
        // (naming the fqn) before reading any of its bytes.
        if (item.type == WriteItemType::kTensor && shard->data.size() == item.nbytes && shard->data.data() != nullptr) {
          std::byte* to = arena.data() + offset;
          for (std::size_t done = 0; done < shard->data.size(); done += kCopySliceBytes) {
            slices.push_back(
                {shard->data.data() + done, to + done, std::min(kCopySliceBytes, shard->data.size() - done)});
          }
          shard->data = std::span<std::byte>(to, shard->data.size());
          offset += round_up(item.nbytes, kStageAlignment);
          async_report_.staged_bytes += item.nbytes;
        }
      } else {
        value = snapshot_object(std::get<pickle::ValuePtr>(value), item.index.fqn);
      }
      staged_.items.emplace(item.index.fqn, std::move(value));
    }
    copy_slices(slices, copy_threads_);
    planned_.flat = {};  // no reference to the caller's buffers survives the stall
  }

  // Step 3 (background thread): no communicator calls here.
  void write() {
    const auto t = Clock::now();
    result_ = save_steps::write_rank_files(planned_.plan, staged_, st_, options_, committed_, report_.bytes_written);
    report_.write_seconds = seconds_since(t);
    writes_done_.store(true);
  }

  void join_writer() noexcept {
    if (writer_.joinable()) writer_.join();
    if (leased_) {
      pool_->return_arena();
      leased_ = false;
    }
  }

  storage::Storage& st_;
  comm::Communicator& comm_;
  const SaveOptions options_;
  const int copy_threads_;
  std::unique_ptr<StagingPool> own_pool_;  // when the caller gave none
  StagingPool* pool_ = nullptr;
  bool leased_ = false;

  save_steps::PlannedSave planned_;
  FlatStateDict staged_;  // the items this rank writes, over staged copies
  save_steps::CommittedFiles committed_;
  std::string result_;  // step 3's message for step 4
  SaveReport report_;
  AsyncSaveReport async_report_;
  std::atomic<bool> writes_done_{false};
  bool waited_ = false;
  std::exception_ptr outcome_;
  std::jthread writer_;  // last: joined before the members it uses are destroyed
};

// ---------------------------------------------------------------------------------------
// PendingSave, async_save

PendingSave::PendingSave(std::shared_ptr<AsyncSaveJob> job) : job_(std::move(job)) {}
PendingSave::~PendingSave() = default;
SaveReport PendingSave::wait() { return job_->wait(); }
bool PendingSave::writes_done() const { return job_->writes_done(); }
const AsyncSaveReport& PendingSave::report() const { return job_->async_report(); }

std::unique_ptr<PendingSave> async_save(const StateNode& state, storage::Storage& checkpoint, comm::Communicator& comm,
                                        const AsyncSaveOptions& options) {
  if (options.staging != nullptr) {
    // The previous save staged in this pool commits first (collective: every rank's pool
    // has one in flight at the same point).
    const std::shared_ptr<AsyncSaveJob> previous = AsyncSaveJob::in_flight(*options.staging);
    if (previous && !previous->waited()) previous->wait();
  }
  auto job = std::make_shared<AsyncSaveJob>(checkpoint, comm, options);
  job->start(state);
  if (options.staging != nullptr) AsyncSaveJob::set_in_flight(*options.staging, job);
  return std::make_unique<PendingSave>(std::move(job));
}

}  // namespace shardpoint::engine
