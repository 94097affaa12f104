// TCP driver across real processes: comm_worker_tcp (linked with sp_comm_env_tcp: no LibTorch,
// no MPI) started as N ranks by launch_ranks with torchrun's variables, so it picks the TCP
// driver by default; comm_worker (all drivers) picks it through SHARDPOINT_COMM=tcp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "launch_ranks.h"

namespace shardpoint::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

const std::string kTcpWorker = SP_COMM_WORKER_TCP;
const std::string kWorker = SP_COMM_WORKER;

LaunchOptions with_timeout(std::chrono::seconds timeout, EnvVars env = {}) {
  LaunchOptions options;
  options.timeout = timeout;
  options.env = std::move(env);
  return options;
}

std::string all_outputs(const std::vector<ProcessResult>& results) {
  std::string out;
  for (std::size_t r = 0; r < results.size(); ++r) out += "--- rank " + std::to_string(r) + ": " + results[r].describe();
  return out;
}

TEST(TcpCommunicatorTest, CollectivesAcrossFourProcesses) {
  auto results = launch_ranks(kTcpWorker, {"collectives"}, 4, with_timeout(120s));
  ASSERT_EQ(results.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("rank " + std::to_string(r) + ": collectives ok (tcp, world 4)"));
  }
}

TEST(TcpCommunicatorTest, CollectivesAcrossTwoAndSevenProcesses) {
  for (int world : {2, 7}) {
    auto results = launch_ranks(kTcpWorker, {"collectives"}, world, with_timeout(120s));
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
      EXPECT_THAT(results[r].output, HasSubstr("collectives ok (tcp, world " + std::to_string(world) + ")"));
    }
  }
}

TEST(TcpCommunicatorTest, ChosenBySHARDPOINT_COMMInABuildWithEveryDriver) {
  auto results = launch_ranks(kWorker, {"collectives"}, 3, with_timeout(120s, {{"SHARDPOINT_COMM", "tcp"}}));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("collectives ok (tcp, world 3)"));
  }
}

TEST(TcpCommunicatorTest, ProcessCarriesNoLibTorch) {
  auto results = launch_ranks(kTcpWorker, {"libraries"}, 2, with_timeout(60s));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("libtorch loaded: no (tcp)"));
  }
}

TEST(TcpCommunicatorTest, DeadRankGivesCommErrorNamingItToTheOthersNotAHang) {
  // Timeout 30 s: the others must learn of the closed connection long before it.
  auto results = launch_ranks(kTcpWorker, {"die", "--timeout-ms", "30000"}, 4, with_timeout(120s));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[3].exit_code, 3) << all_outputs(results);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_FALSE(results[r].timed_out);
    EXPECT_THAT(results[r].output, HasSubstr("tcp rank " + std::to_string(r) + "/4: barrier failed after"));
    EXPECT_THAT(results[r].output, HasSubstr("rank 3 closed its connection"));
    EXPECT_LT(results[r].seconds, 25.0) << all_outputs(results);
  }
}

TEST(TcpCommunicatorTest, DeadCoordinatorGivesCommErrorToTheOthers) {
  auto results = launch_ranks(kTcpWorker, {"die-first", "--timeout-ms", "30000"}, 3, with_timeout(120s));
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].exit_code, 3) << all_outputs(results);
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("rank 0 (the coordinator) closed its connection"));
    EXPECT_LT(results[r].seconds, 25.0) << all_outputs(results);
  }
}

TEST(TcpCommunicatorTest, SlowRankMakesTheOthersTimeOut) {
  auto results = launch_ranks(kTcpWorker, {"slow", "--timeout-ms", "1000"}, 4, with_timeout(120s));
  ASSERT_EQ(results.size(), 4u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("got CommError"));
    EXPECT_THAT(results[r].output, HasSubstr("(timeout 1 s)"));
  }
  EXPECT_THAT(results[0].output, HasSubstr("timed out waiting for rank 3"));
  // The slow rank comes to a group that is gone: it must fail too, not hang.
  EXPECT_EQ(results[3].exit_code, 0) << all_outputs(results);
  EXPECT_FALSE(results[3].timed_out);
}

TEST(TcpCommunicatorTest, DifferentCollectivesOnDifferentRanksAreDetected) {
  auto results = launch_ranks(kTcpWorker, {"mismatch", "--timeout-ms", "30000"}, 3, with_timeout(120s));
  ASSERT_EQ(results.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("rank 2 called gather(root 0) (collective #2) while rank 0 called "
                                             "barrier (collective #2)"));
    EXPECT_LT(results[r].seconds, 25.0) << all_outputs(results);
  }
}

TEST(TcpCommunicatorTest, MissingRankMakesJoiningTimeOut) {
  // World of 3, only ranks 0 and 1 start.
  const int port = pick_free_port();
  std::vector<Command> commands;
  for (int r = 0; r < 2; ++r) {
    commands.push_back({{kTcpWorker, "collectives", "--timeout-ms", "1500"},
                        {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"}, {"MASTER_PORT", std::to_string(port)}}});
  }
  auto results = run_processes(commands, 60s);
  EXPECT_EQ(results[0].exit_code, 2) << all_outputs(results);
  EXPECT_THAT(results[0].output, HasSubstr("waiting for rank 2 to connect"));
  EXPECT_EQ(results[1].exit_code, 2) << all_outputs(results);
  EXPECT_THAT(results[1].output, HasSubstr("tcp rank 1/3: joining the group at 127.0.0.1:" + std::to_string(port)));
}

TEST(TcpCommunicatorTest, RankWithAnotherWorldSizeIsRefused) {
  const int port = pick_free_port();
  std::vector<Command> commands = {
      {{kTcpWorker, "collectives", "--timeout-ms", "20000"},
       {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", std::to_string(port)}}},
      {{kTcpWorker, "collectives", "--timeout-ms", "20000"},
       {{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"MASTER_PORT", std::to_string(port)}}}};
  auto results = run_processes(commands, 60s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 2) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("rank 1 says WORLD_SIZE=3, rank 0 has WORLD_SIZE=2"));
    EXPECT_LT(results[r].seconds, 15.0) << all_outputs(results);
  }
}

TEST(TcpCommunicatorTest, InvalidRankIsAUsageError) {
  ProcessResult r = run_process({kTcpWorker, "collectives"},
                                {{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29999"}}, 60s);
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_THAT(r.output, HasSubstr("RANK=4 is not below WORLD_SIZE=4"));
}

TEST(TcpCommunicatorTest, UnknownDriverNameIsAUsageError) {
  ProcessResult r = run_process({kTcpWorker, "collectives"},
                                {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SHARDPOINT_COMM", "nccl"}}, 60s);
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_THAT(r.output, HasSubstr("SHARDPOINT_COMM=\"nccl\": expected single, tcp, gloo or mpi"));
}

}  // namespace
}  // namespace shardpoint::testing
