// tests/launch_ranks.h and src/comm/launch.h under it: the launcher every multi-process test
// and `shardpoint-train --devices N` rely on.
#include "launch_ranks.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <set>

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
  auto results = launch_ranks("/bin/sh",
                              {"-c", "echo $RANK/$WORLD_SIZE $LOCAL_RANK $MASTER_ADDR:$MASTER_PORT $SP_EXTRA; "
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

TEST(LaunchRanksTest, ReservedPortsAreDistinctAndLockedUntilReleased) {
  std::vector<comm::PortReservation> held;
  std::set<int> ports;
  for (int i = 0; i < 50; ++i) {
    held.push_back(comm::reserve_port());
    ports.insert(held.back().port());
  }
  EXPECT_EQ(ports.size(), held.size());

  // Another launcher (another open file description) cannot take a held port's lock.
  const int port = held.front().port();
  const std::string lock_path = "/tmp/shardpoint-ports/" + std::to_string(port) + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << lock_path;
  EXPECT_NE(::flock(fd, LOCK_EX | LOCK_NB), 0);
  held.erase(held.begin());
  EXPECT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ::close(fd);
}

TEST(LaunchRanksTest, UncapturedRanksShareOurOutputAndStillTimeOut) {
  comm::LaunchOptions options;  // as shardpoint-train launches: output not captured
  options.capture_output = false;
  options.timeout = 500ms;
  auto results = comm::launch_ranks({"/bin/sh", "-c", "if [ $RANK = 1 ]; then exec sleep 30; fi; exit 4"}, 2, options);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].exit_code, 4);
  EXPECT_EQ(results[0].output, "");
  EXPECT_TRUE(results[1].timed_out);
  EXPECT_EQ(results[1].signal, SIGKILL);
}

}  // namespace
}  // namespace shardpoint::testing
