// Gloo driver across real processes: comm_worker started as 4 ranks by launch_ranks (RANK,
// WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), as torchrun would.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "launch_ranks.h"

namespace shardpoint::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

const std::string kWorker = SP_COMM_WORKER;

LaunchOptions with_timeout(std::chrono::seconds timeout) {
  LaunchOptions options;
  options.timeout = timeout;
  return options;
}

std::string all_outputs(const std::vector<ProcessResult>& results) {
  std::string out;
  for (std::size_t r = 0; r < results.size(); ++r) out += "--- rank " + std::to_string(r) + ": " + results[r].describe();
  return out;
}

TEST(GlooCommunicatorTest, CollectivesAcrossFourProcesses) {
  auto results = launch_ranks(kWorker, {"collectives"}, 4, with_timeout(180s));
  ASSERT_EQ(results.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("rank " + std::to_string(r) + ": collectives ok (gloo, world 4)"));
  }
}

TEST(GlooCommunicatorTest, CollectivesAcrossTwoProcesses) {
  auto results = launch_ranks(kWorker, {"collectives"}, 2, with_timeout(120s));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("collectives ok (gloo, world 2)"));
  }
}

TEST(GlooCommunicatorTest, DeadRankGivesCommErrorToTheOthersNotAHang) {
  // Timeout 30 s: the others must notice the closed connections long before it.
  auto results = launch_ranks(kWorker, {"die", "--timeout-ms", "30000"}, 4, with_timeout(120s));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[3].exit_code, 3) << all_outputs(results);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_FALSE(results[r].timed_out);
    EXPECT_THAT(results[r].output, HasSubstr("got CommError"));
    EXPECT_THAT(results[r].output, HasSubstr("gloo rank " + std::to_string(r) + "/4: barrier failed after"));
    EXPECT_LT(results[r].seconds, 25.0) << all_outputs(results);
  }
}

TEST(GlooCommunicatorTest, SlowRankMakesTheOthersTimeOut) {
  auto results = launch_ranks(kWorker, {"slow", "--timeout-ms", "1000"}, 4, with_timeout(120s));
  ASSERT_EQ(results.size(), 4u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("got CommError"));
    EXPECT_THAT(results[r].output, HasSubstr("(timeout 1 s)"));
  }
  // The slow rank comes to a group that is gone: it must fail too, not hang.
  EXPECT_EQ(results[3].exit_code, 0) << all_outputs(results);
  EXPECT_FALSE(results[3].timed_out);
}

TEST(GlooCommunicatorTest, InvalidRankIsAUsageError) {
  ProcessResult r = run_process({kWorker, "collectives"},
                                {{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29999"}}, 60s);
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_THAT(r.output, HasSubstr("RANK=4 is not below WORLD_SIZE=4"));
}

}  // namespace
}  // namespace shardpoint::testing
