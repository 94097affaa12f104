// TCP driver across real processes: comm_worker_tcp (linked with sp_comm_env_tcp: no LibTorch,
// no MPI) started as N ranks by launch_ranks with torchrun's variables, so it picks the TCP
// driver by default; comm_worker (all drivers) picks it through SHARDPOINT_COMM=tcp.
// The cases every driver passes are multi_process_cases.cc; the TCP star's own ones are here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "multi_process_cases.h"

namespace shardpoint::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

const std::string kTcpWorker = SP_COMM_WORKER_TCP;
const std::string kWorker = SP_COMM_WORKER;

INSTANTIATE_TEST_SUITE_P(Tcp, MultiProcessCommTest,
                         ::testing::Values(CommDriverUnderTest{
                             .name = "tcp",
                             .worker = kTcpWorker,
                             .dead_rank_detail = "rank 3 closed its connection",
                             .slow_rank_detail_on_rank0 = "timed out waiting for rank 3"}),
                         CommDriverName());

TEST(TcpCommunicatorTest, CollectivesAcrossSevenProcesses) {
  expect_collectives_ok({.name = "tcp", .worker = kTcpWorker}, 7, 120s);
}

TEST(TcpCommunicatorTest, ChosenBySHARDPOINT_COMMInABuildWithEveryDriver) {
  expect_collectives_ok({.name = "tcp", .worker = kWorker, .env = {{"SHARDPOINT_COMM", "tcp"}}}, 3, 120s);
}

TEST(TcpCommunicatorTest, ProcessCarriesNoLibTorch) {
  auto results = launch_ranks(kTcpWorker, {"libraries"}, 2, with_timeout(60s));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << all_outputs(results);
    EXPECT_THAT(results[r].output, HasSubstr("libtorch loaded: no (tcp)"));
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
  std::vector<Command> commands = {{{kTcpWorker, "collectives", "--timeout-ms", "20000"},
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

TEST(TcpCommunicatorTest, UnknownDriverNameIsAUsageError) {
  ProcessResult r =
      run_process({kTcpWorker, "collectives"}, {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SHARDPOINT_COMM", "nccl"}}, 60s);
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_THAT(r.output, HasSubstr("SHARDPOINT_COMM=\"nccl\": expected single, tcp, gloo or mpi"));
}

}  // namespace
}  // namespace shardpoint::testing
