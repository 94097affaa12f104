// tests/launch_ranks.h: the helper every multi-process test relies on.
#include "launch_ranks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardpoint::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(LaunchRanksTest, EachRankGetsTorchrunEnvironmentAndOutputIsCaptured) {
  LaunchOptions options;
  options.env = {{"SP_EXTRA", "x"}};
  options.master_port = 23456;
  auto results = launch_ranks("/bin/sh", {"-c", "echo $RANK/$WORLD_SIZE $LOCAL_RANK $MASTER_ADDR:$MASTER_PORT $SP_EXTRA; "
                                                "echo err >&2; exit $((RANK + 10))"},
                              3, options);
  ASSERT_EQ(results.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 10 + r);
    EXPECT_EQ(results[r].output, std::to_string(r) + "/3 " + std::to_string(r) + " 127.0.0.1:23456 x\nerr\n");
    EXPECT_FALSE(results[r].timed_out);
  }
}

TEST(LaunchRanksTest, StragglersAreKilledAtTheTimeout) {
  LaunchOptions options;
  options.timeout = 500ms;
  const auto start = std::chrono::steady_clock::now();
  auto results = launch_ranks("/bin/sh", {"-c", "if [ $RANK = 1 ]; then sleep 30; fi; echo done"}, 2, options);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(results[0].exit_code, 0);
  EXPECT_FALSE(results[0].timed_out);
  EXPECT_TRUE(results[1].timed_out);
  EXPECT_EQ(results[1].signal, SIGKILL);
  EXPECT_THAT(results[1].describe(), HasSubstr("TIMED OUT"));
}

TEST(LaunchRanksTest, MissingProgramIsReportedNotThrown) {
  ProcessResult r = run_process({"/nonexistent/program"}, {}, 5s);
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_THAT(r.output, HasSubstr("/nonexistent/program"));
}

TEST(LaunchRanksTest, PickFreePortIsInTheAgreedRange) {
  for (int i = 0; i < 20; ++i) {
    const int port = pick_free_port();
    EXPECT_GE(port, 21000);
    EXPECT_LE(port, 28999);
  }
}

}  // namespace
}  // namespace shardpoint::testing
