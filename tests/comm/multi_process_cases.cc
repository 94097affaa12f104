// The driver-independent multi-process cases; see multi_process_cases.h.
#include "multi_process_cases.h"

#include <gmock/gmock.h>

namespace shardpoint::testing {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

void expect_collectives_ok(const CommDriverUnderTest& driver, int world, std::chrono::seconds timeout) {
  auto results = launch_ranks(driver.worker, {"collectives"}, world, with_timeout(timeout, driver.env));
  ASSERT_EQ(results.size(), static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("rank " + std::to_string(r) + ": collectives ok (" + driver.name +
                                             ", world " + std::to_string(world) + ")"));
  }
}

namespace {

TEST_P(MultiProcessCommTest, CollectivesAcrossFourProcesses) { expect_collectives_ok(GetParam(), 4, 180s); }

TEST_P(MultiProcessCommTest, CollectivesAcrossTwoProcesses) { expect_collectives_ok(GetParam(), 2, 120s); }

TEST_P(MultiProcessCommTest, DeadRankGivesCommErrorToTheOthersNotAHang) {
  const CommDriverUnderTest& driver = GetParam();
  // Timeout 30 s: the others must learn of the closed connection long before it.
  auto results = launch_ranks(driver.worker, {"die", "--timeout-ms", "30000"}, 4, with_timeout(120s, driver.env));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[3].exit_code, 3) << all_outputs(results);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_FALSE(results[r].timed_out);
    EXPECT_THAT(results[r].output, HasSubstr("got CommError"));
    EXPECT_THAT(results[r].output, HasSubstr(driver.name + " rank " + std::to_string(r) + "/4: barrier failed after"));
    EXPECT_THAT(results[r].output, HasSubstr(driver.dead_rank_detail));
    EXPECT_LT(results[r].seconds, 25.0) << all_outputs(results);
  }
}

TEST_P(MultiProcessCommTest, SlowRankMakesTheOthersTimeOut) {
  const CommDriverUnderTest& driver = GetParam();
  auto results = launch_ranks(driver.worker, {"slow", "--timeout-ms", "1000"}, 4, with_timeout(120s, driver.env));
  ASSERT_EQ(results.size(), 4u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("got CommError"));
    EXPECT_THAT(results[r].output, HasSubstr("(timeout 1 s)"));
  }
  EXPECT_THAT(results[0].output, HasSubstr(driver.slow_rank_detail_on_rank0));
  // The slow rank comes to a group that is gone: it must fail too, not hang.
  EXPECT_EQ(results[3].exit_code, 0) << all_outputs(results);
  EXPECT_FALSE(results[3].timed_out);
}

TEST_P(MultiProcessCommTest, InvalidRankIsAUsageError) {
  const CommDriverUnderTest& driver = GetParam();
  EnvVars env = driver.env;
  env.insert(env.end(), {{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29999"}});
  ProcessResult r = run_process({driver.worker, "collectives"}, env, 60s);
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_THAT(r.output, HasSubstr("RANK=4 is not below WORLD_SIZE=4"));
}

}  // namespace
}  // namespace shardpoint::testing
