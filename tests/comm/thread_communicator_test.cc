#include "comm/thread_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "shardpoint/error.h"

namespace shardpoint::comm {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string payload(int rank, std::size_t size) {
  std::string s(size, '\0');
  for (std::size_t i = 0; i < size; ++i) s[i] = static_cast<char>((rank * 131 + i * 7) & 0xff);
  return s;
}

std::size_t size_for(int rank) { return rank == 1 ? 0 : static_cast<std::size_t>(rank) * 37 + 5; }

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

class ThreadCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCollectivesTest, EveryCollectiveOnEveryRank) {
  const int n = GetParam();
  ThreadGroup group(n, {.timeout = 20s});
  group.run([&](Communicator& comm) {
    const int me = comm.rank();
    ASSERT_EQ(comm.world_size(), n);
    EXPECT_EQ(comm.name(), "threads");
    comm.barrier();
    for (int root = 0; root < n; ++root) {
      EXPECT_EQ(comm.broadcast(me == root ? payload(root, size_for(root)) : "ignored", root),
                payload(root, size_for(root)));
    }
    for (int root = 0; root < n; ++root) {
      std::vector<std::string> g = comm.gather(payload(me, size_for(me)), root);
      if (me == root) {
        ASSERT_EQ(static_cast<int>(g.size()), n);
        for (int r = 0; r < n; ++r) EXPECT_EQ(g[r], payload(r, size_for(r)));
      } else {
        EXPECT_TRUE(g.empty());
      }
    }
    std::vector<std::string> all = comm.all_gather(payload(me, size_for(me)));
    ASSERT_EQ(static_cast<int>(all.size()), n);
    for (int r = 0; r < n; ++r) EXPECT_EQ(all[r], payload(r, size_for(r)));
    for (int root = 0; root < n; ++root) {
      std::vector<std::string> pieces;
      if (me == root) {
        for (int r = 0; r < n; ++r) pieces.push_back(payload(10 * root + r, size_for(r)));
      }
      EXPECT_EQ(comm.scatter(pieces, root), payload(10 * root + me, size_for(me)));
    }
    EXPECT_EQ(comm.all_reduce(std::int64_t{me + 1}, ReduceOp::kSum), std::int64_t{n} * (n + 1) / 2);
    EXPECT_EQ(comm.all_reduce(std::int64_t{me}, ReduceOp::kMin), 0);
    EXPECT_EQ(comm.all_reduce(std::int64_t{me}, ReduceOp::kMax), n - 1);
    EXPECT_DOUBLE_EQ(comm.all_reduce(0.5 * me, ReduceOp::kSum), 0.25 * n * (n - 1));
    EXPECT_DOUBLE_EQ(comm.all_reduce(-1.0 * me, ReduceOp::kMin), -1.0 * (n - 1));
    EXPECT_DOUBLE_EQ(comm.all_reduce(1.0 * me, ReduceOp::kMax), 1.0 * (n - 1));
    EXPECT_TRUE(comm.all_ok(true));
    EXPECT_FALSE(comm.all_ok(me != n - 1));
    EXPECT_EQ(comm.all_errors(me == n - 1 ? "disk full" : ""), (std::vector<RankError>{{n - 1, "disk full"}}));
    comm.barrier(kNoTimeout);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadCollectivesTest, ::testing::Values(1, 2, 3, 4, 7));

TEST(ThreadGroupTest, ManyStepsInARowKeepTheirOrder) {
  ThreadGroup group(4, {.timeout = 20s});
  group.run([](Communicator& comm) {
    for (int step = 0; step < 300; ++step) {
      std::vector<std::string> all = comm.all_gather(std::to_string(step * 10 + comm.rank()));
      for (int r = 0; r < 4; ++r) ASSERT_EQ(all[r], std::to_string(step * 10 + r)) << "step " << step;
      ASSERT_EQ(comm.broadcast(std::to_string(step), step % 4), std::to_string(step));
    }
  });
}

TEST(ThreadGroupTest, ExceptionOfOneRankIsRethrownAndReleasesTheOthers) {
  ThreadGroup group(4, {.timeout = 60s});
  const auto start = Clock::now();
  try {
    group.run([](Communicator& comm) {
      if (comm.rank() == 2) throw std::runtime_error("boom on rank 2");
      comm.barrier();
    });
    FAIL() << "no exception";
  } catch (const CommError& e) {
    FAIL() << "got the derived CommError, not the root cause: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom on rank 2");
  }
  EXPECT_LT(seconds_since(start), 10.0) << "the others waited for the timeout";
}

TEST(ThreadGroupTest, RunAllReportsEachRank) {
  ThreadGroup group(3, {.timeout = 60s});
  std::vector<std::exception_ptr> errors = group.run_all([](Communicator& comm) {
    if (comm.rank() == 0) throw PlanError("no key");
    comm.all_gather("x");
  });
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_THROW(std::rethrow_exception(errors[0]), PlanError);
  for (int r : {1, 2}) {
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 0 failed: no key"));
      EXPECT_THAT(e.what(), HasSubstr("threads rank " + std::to_string(r) + "/3: all_gather(1 bytes)"));
    }
  }
}

TEST(ThreadGroupTest, MissingRankTimesOutWithCommError) {
  ThreadGroup group(4, {.timeout = 200ms});
  const auto start = Clock::now();
  std::vector<std::exception_ptr> errors = group.run_all([](Communicator& comm) {
    if (comm.rank() == 3) std::this_thread::sleep_for(1500ms);
    comm.barrier();
  });
  EXPECT_LT(seconds_since(start), 5.0);
  int timeouts = 0;
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " returned normally";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_THAT(what, HasSubstr("threads rank " + std::to_string(r) + "/4: barrier failed after"));
      EXPECT_THAT(what, HasSubstr("(timeout 0.20 s)"));
      if (what.find("timed out waiting for rank(s) 3") != std::string::npos) ++timeouts;
    }
  }
  EXPECT_GE(timeouts, 1);
}

TEST(ThreadGroupTest, PerCallTimeoutOverridesTheDefault) {
  ThreadGroup group(2, {.timeout = 60s});
  const auto start = Clock::now();
  EXPECT_THROW(group.run([](Communicator& comm) {
    if (comm.rank() == 1) std::this_thread::sleep_for(1s);
    comm.barrier(100ms);
  }),
               CommError);
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(ThreadGroupTest, RankThatReturnsEarlyReleasesTheOthers) {
  ThreadGroup group(3, {.timeout = 60s});
  const auto start = Clock::now();
  try {
    group.run([](Communicator& comm) {
      if (comm.rank() == 1) return;  // forgot the barrier
      comm.barrier();
    });
    FAIL() << "no exception";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank(s) 1 left the group without joining it"));
  }
  EXPECT_LT(seconds_since(start), 10.0);
}

TEST(ThreadGroupTest, DifferentCollectivesAreDetected) {
  ThreadGroup group(3, {.timeout = 60s});
  try {
    group.run([](Communicator& comm) {
      if (comm.rank() == 0) {
        comm.barrier();
      } else {
        comm.broadcast("x", 1);
      }
    });
    FAIL() << "no exception";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("collective mismatch: rank 0: barrier, rank 1: broadcast(root 1)"));
  }
}

TEST(ThreadGroupTest, CommunicatorIsUnusableAfterAFailure) {
  ThreadGroup group(2, {.timeout = 100ms});
  std::atomic<int> second_errors{0};
  group.run_all([&](Communicator& comm) {
    if (comm.rank() == 0) {
      EXPECT_THROW(comm.barrier(), CommError);  // rank 1 never comes
      try {
        comm.all_gather("again");
      } catch (const CommError& e) {
        EXPECT_THAT(e.what(), HasSubstr("communicator unusable after an earlier failure"));
        ++second_errors;
      }
    } else {
      std::this_thread::sleep_for(400ms);
    }
  });
  EXPECT_EQ(second_errors, 1);
}

TEST(ThreadGroupTest, GroupCanRunAgainAfterAFailedRun) {
  ThreadGroup group(3, {.timeout = 5s});
  EXPECT_THROW(group.run([](Communicator& comm) {
    if (comm.rank() == 1) throw UsageError("first run fails");
    comm.barrier();
  }),
               UsageError);
  std::atomic<int> ok{0};
  group.run([&](Communicator& comm) {
    EXPECT_EQ(comm.all_reduce(std::int64_t{1}, ReduceOp::kSum), 3);
    ++ok;
  });
  EXPECT_EQ(ok, 3);
}

TEST(ThreadGroupTest, RethrowIfAnyFailedKeepsCategoryAndNamesTheRank) {
  ThreadGroup group(4, {.timeout = 20s});
  group.run([](Communicator& comm) {
    std::exception_ptr local;
    if (comm.rank() == 1)
      local = std::make_exception_ptr(StorageError(StorageError::Kind::kPermission, "open /x: denied"));
    if (comm.rank() == 3) local = std::make_exception_ptr(FormatError("bad header"));
    try {
      comm.rethrow_if_any_failed(local);
      ADD_FAILURE() << "rank " << comm.rank() << " did not throw";
    } catch (const StorageError& e) {
      if (comm.rank() == 1) {
        EXPECT_STREQ(e.what(), "open /x: denied");
      } else {
        EXPECT_EQ(comm.rank() == 3, false) << "rank 3 must rethrow its own FormatError";
        EXPECT_EQ(e.kind(), StorageError::Kind::kPermission);
        EXPECT_STREQ(e.what(), "rank 1: open /x: denied (and 1 more ranks failed)");
      }
    } catch (const FormatError& e) {
      EXPECT_EQ(comm.rank(), 3);
      EXPECT_STREQ(e.what(), "bad header");
    }
    comm.rethrow_if_any_failed(nullptr);  // the group still works afterwards
  });
}

TEST(ThreadGroupTest, SerializedUseFromAnotherThreadOfTheRank) {
  ThreadGroup group(2, {.timeout = 20s});
  group.run([](Communicator& comm) {
    std::string got;
    std::thread helper([&] { got = comm.broadcast("from helper", 0); });
    helper.join();
    EXPECT_EQ(got, "from helper");
  });
}

TEST(ThreadGroupTest, InvalidWorldSize) { EXPECT_THROW(ThreadGroup(0), UsageError); }

}  // namespace
}  // namespace shardpoint::comm
