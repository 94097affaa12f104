// async_save(): the same files as save(), independence from the caller's buffers after it
// returns, failures agreed by every rank's wait(), saves in a row over one staging pool,
// the staging bound; and real processes over Gloo, or TCP without it (async_save_worker).
#include "shardpoint/async_save.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "comm/thread_communicator.h"
#include "engine/checkpoint_test_state.h"
#include "launch_ranks.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/fault_injection_storage.h"
#include "storage/local_storage.h"
#include "storage/memory_storage.h"
#include "storage/storage_wrapper.h"
#include "test_util.h"

namespace shardpoint::engine {
namespace {

using testing::compare_with_expected;
using testing::make_rank_state;
using testing::RankState;

comm::CommOptions fast() { return comm::CommOptions{std::chrono::seconds(20)}; }

std::shared_ptr<storage::Storage> memory() { return storage::open_memory_storage(Location::parse("memory://"), {}); }

std::vector<RankState> filled_states(int world) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, true));
  return states;
}

// Every object of the folder: key -> bytes.
std::map<std::string, std::string> contents(storage::Storage& st) {
  std::map<std::string, std::string> out;
  for (const storage::ObjectInfo& info : st.list("")) {
    std::string bytes(static_cast<std::size_t>(info.size), '\0');
    st.read(info.key, 0, std::as_writable_bytes(std::span<char>(bytes.data(), bytes.size())));
    out.emplace(info.key, std::move(bytes));
  }
  return out;
}

void load_and_check(int world, storage::Storage& st) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, false));
  comm::ThreadGroup group(world, fast());
  group.run([&](comm::Communicator& comm) { load(states[comm.rank()].root, st, comm); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(compare_with_expected(states[r], r, world), "") << "rank " << r;
}

// Holds every open_writer() until open() is called: the files are written only after the
// test has changed the state.
class GatedStorage final : public storage::StorageWrapper {
 public:
  explicit GatedStorage(std::shared_ptr<storage::Storage> target) : StorageWrapper(std::move(target)) {}
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::unique_ptr<storage::StorageWriter> open_writer(std::string_view key, const storage::WriteOptions& options = {},
                                                      const storage::IoOptions& io = {}) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return open_; });
    lock.unlock();
    return StorageWrapper::open_writer(key, options, io);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Overwrites every tensor byte and changes every object leaf of a saved state.
void scribble(RankState& state) {
  for (auto& buffer : state.buffers) std::fill(buffer->begin(), buffer->end(), std::byte{0xA5});
  state.root.set("epoch", StateNode(pickle::Value::integer(-1)));
  StateNode& group = state.root.find("optim")->find("param_groups")->list()[0];
  group.find("params")->object()->mutable_items().push_back(pickle::Value::integer(99));
}

TEST(AsyncSaveTest, WritesTheSameFilesAsSave) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE("thread_count " + std::to_string(threads));
    shardpoint::testing::TempDir dir;
    auto sync_st = storage::open_local_storage_at(dir.file("sync"));
    auto async_st = storage::open_local_storage_at(dir.file("async"));
    SaveOptions options;
    options.durable = false;
    options.thread_count = threads;
    std::vector<RankState> states = filled_states(4);
    comm::ThreadGroup group(4, fast());
    group.run([&](comm::Communicator& comm) { save(states[comm.rank()].root, *sync_st, comm, options); });
    std::vector<AsyncSaveReport> reports(4);
    group.run([&](comm::Communicator& comm) {
      AsyncSaveOptions async_options;
      async_options.save = options;
      auto pending = async_save(states[comm.rank()].root, *async_st, comm, async_options);
      reports[comm.rank()] = pending->report();
      pending->wait();
    });
    const auto want = contents(*sync_st);
    const auto got = contents(*async_st);
    ASSERT_FALSE(want.empty());
    EXPECT_TRUE(want.contains(".metadata"));
    EXPECT_TRUE(want.contains(kChecksumSidecar));
    EXPECT_EQ(got.size(), want.size());
    for (const auto& [key, bytes] : want) {
      auto it = got.find(key);
      ASSERT_NE(it, got.end()) << key;
      EXPECT_TRUE(it->second == bytes) << key << " differs";
    }
    std::uint64_t staged = 0;
    for (const auto& r : reports) {
      staged += r.staged_bytes;
      EXPECT_GE(r.stall_seconds, r.copy_seconds);
    }
    // Replicated tensors are staged once (by the rank that writes them), sharded ones once.
    std::uint64_t tensor_total = 0;
    for (const auto& spec : testing::tensor_specs()) {
      std::int64_t n = 1;
      for (auto d : spec.shape) n *= d;
      tensor_total += static_cast<std::uint64_t>(n) * dtype_itemsize(spec.dtype);
    }
    EXPECT_EQ(staged, tensor_total);
  }
}

TEST(AsyncSaveTest, ChangingTheStateAfterReturnDoesNotChangeTheCheckpoint) {
  std::shared_ptr<storage::Storage> target = memory();
  GatedStorage st(target);
  std::vector<RankState> states = filled_states(3);
  comm::ThreadGroup group(3, fast());
  std::atomic<int> done_before_gate{0};
  group.run([&](comm::Communicator& comm) {
    auto pending = async_save(states[comm.rank()].root, st, comm);
    scribble(states[comm.rank()]);
    // The trainer's own collectives run while the writer threads are (here: held) busy.
    comm.barrier();
    if (pending->writes_done()) ++done_before_gate;
    comm.barrier();
    if (comm.rank() == 0) st.open();
    pending->wait();
  });
  EXPECT_EQ(done_before_gate.load(), 0);
  for (int r = 0; r < 3; ++r) EXPECT_NE(compare_with_expected(states[r], r, 3), "");  // really changed
  load_and_check(3, *target);
  load_and_check(2, *target);
}

TEST(AsyncSaveTest, OneRankFailsEveryRanksWaitThrowsNothingCommitted) {
  for (storage::FaultOp op : {storage::FaultOp::kWrite, storage::FaultOp::kCommit, storage::FaultOp::kOpenWriter}) {
    auto target = memory();
    storage::FaultInjectionStorage faulty(target);
    faulty.fail(storage::FaultRule{op, 1, StorageError::Kind::kNoSpace, "__1_0"});
    std::vector<RankState> states = filled_states(3);
    comm::ThreadGroup group(3, fast());
    std::vector<int> started(3, 0);
    auto errors = group.run_all([&](comm::Communicator& comm) {
      auto pending = async_save(states[comm.rank()].root, faulty, comm);
      started[comm.rank()] = 1;
      pending->wait();
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(started[r], 1) << "async_save itself does not fail on rank " << r;
      ASSERT_TRUE(errors[r]) << "rank " << r << " did not throw";
      try {
        std::rethrow_exception(errors[r]);
      } catch (const StorageError& e) {
        EXPECT_NE(std::string(e.what()).find("save failed on rank 1 (of 3): rank 1: "), std::string::npos) << e.what();
        EXPECT_EQ(e.kind(), StorageError::Kind::kNoSpace);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": expected StorageError, got " << e.what();
      }
    }
    EXPECT_EQ(faulty.injected(), 1u);
    EXPECT_FALSE(target->try_stat(".metadata"));
    EXPECT_FALSE(target->try_stat(kChecksumSidecar));
    EXPECT_TRUE(target->list("").empty()) << "files of the failed attempt are removed";
  }
}

TEST(AsyncSaveTest, MetadataWriteFailureIsThrownByEveryWait) {
  auto target = memory();
  storage::FaultInjectionStorage faulty(target);
  faulty.fail(storage::FaultRule{storage::FaultOp::kWriteAtomic, 1, StorageError::Kind::kPermission, ".metadata"});
  std::vector<RankState> states = filled_states(2);
  comm::ThreadGroup group(2, fast());
  auto errors = group.run_all([&](comm::Communicator& comm) {
    auto pending = async_save(states[comm.rank()].root, faulty, comm);
    try {
      pending->wait();
    } catch (const StorageError&) {
      // A second wait() reports the same outcome without communicating.
      EXPECT_THROW(pending->wait(), StorageError);
      throw;
    }
  });
  for (const auto& e : errors) EXPECT_TRUE(e);
  EXPECT_TRUE(target->list("").empty());
}

TEST(AsyncSaveTest, SecondSaveOnAPoolCommitsTheFirstAndReusesTheStaging) {
  auto first = memory();
  auto second = memory();
  std::vector<RankState> states = filled_states(2);
  std::vector<std::unique_ptr<StagingPool>> pools;
  for (int r = 0; r < 2; ++r) pools.push_back(std::make_unique<StagingPool>());
  std::vector<std::uint64_t> held(2), held_after(2);
  bool first_committed_at_second_start = false;
  comm::ThreadGroup group(2, fast());
  group.run([&](comm::Communicator& comm) {
    const int r = comm.rank();
    AsyncSaveOptions options;
    options.staging = pools[r].get();
    auto a = async_save(states[r].root, *first, comm, options);
    held[r] = pools[r]->held_bytes();
    scribble(states[r]);
    states[r] = make_rank_state(r, 2, true);
    auto b = async_save(states[r].root, *second, comm, options);
    if (r == 0) first_committed_at_second_start = first->try_stat(".metadata").has_value();
    held_after[r] = pools[r]->held_bytes();
    EXPECT_TRUE(a->writes_done());
    a->wait();  // already committed: returns its report again
    b->wait();
  });
  EXPECT_TRUE(first_committed_at_second_start);
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(held[r], 0u);
    EXPECT_EQ(held_after[r], held[r]) << "the arena is reused, not grown";
  }
  load_and_check(2, *first);
  load_and_check(2, *second);
}

TEST(AsyncSaveTest, StagingBoundFailsEveryRankBeforeWriting) {
  auto st = memory();
  std::vector<RankState> states = filled_states(2);
  std::vector<std::unique_ptr<StagingPool>> pools;
  // Rank 1's bound is too small for its bytes; rank 0's is not.
  pools.push_back(std::make_unique<StagingPool>(StagingPoolOptions{1 << 20, false}));
  pools.push_back(std::make_unique<StagingPool>(StagingPoolOptions{16, false}));
  comm::ThreadGroup group(2, fast());
  auto errors = group.run_all([&](comm::Communicator& comm) {
    AsyncSaveOptions options;
    options.staging = pools[comm.rank()].get();
    async_save(states[comm.rank()].root, *st, comm, options);
  });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const UsageError& ex) {
      EXPECT_NE(std::string(ex.what()).find("save failed on rank 1 (of 2): rank 1: async_save: rank 1 holds"),
                std::string::npos)
          << ex.what();
    } catch (const std::exception& ex) {
      ADD_FAILURE() << "expected UsageError: " << ex.what();
    }
  }
  EXPECT_TRUE(st->list("").empty());
  EXPECT_THROW(pools[0]->reserve(2 << 20), UsageError);
  pools[0]->reserve(1 << 20);
  EXPECT_GE(pools[0]->held_bytes(), 1u << 20);
}

TEST(AsyncSaveTest, DroppedPendingSaveRemovesItsFiles) {
  auto st = memory();
  std::vector<RankState> states = filled_states(2);
  comm::ThreadGroup group(2, fast());
  group.run([&](comm::Communicator& comm) {
    auto pending = async_save(states[comm.rank()].root, *st, comm);
    pending.reset();
    comm.barrier();
  });
  EXPECT_TRUE(st->list("").empty());
}

// ---------------------------------------------------------------------------------------
// Real processes: async_save_worker ranks over Gloo (TCP in builds without it).

std::vector<shardpoint::testing::ProcessResult> run_ranks(int world, const std::vector<std::string>& args) {
  return shardpoint::testing::launch_ranks(SP_ASYNC_SAVE_WORKER, args, world);
}

TEST(AsyncSaveProcessTest, FourProcessesSaveTwiceThenLoadOnTwoAndFour) {
  shardpoint::testing::TempDir dir;
  for (const auto& r : run_ranks(4, {"save-twice", dir.file("a"), dir.file("b")})) {
    EXPECT_EQ(r.exit_code, 0) << r.describe();
  }
  for (const char* ckpt : {"a", "b"}) {
    for (int world : {2, 4}) {
      for (const auto& r : run_ranks(world, {"load", dir.file(ckpt)})) {
        EXPECT_EQ(r.exit_code, 0) << ckpt << " on " << world << ": " << r.describe();
      }
    }
  }
}

TEST(AsyncSaveProcessTest, OneProcessFailsEveryProcessWaitThrows) {
  shardpoint::testing::TempDir dir;
  for (const auto& r : run_ranks(4, {"save-fail-rank-2", dir.file("c")})) {
    EXPECT_EQ(r.exit_code, 0) << r.describe();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("c") + "/.metadata"));
}

}  // namespace
}  // namespace shardpoint::engine
