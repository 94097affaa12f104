// make_communicator_from_env(): driver choice from the environment, env parsing, and a real
// Gloo world of one (TCPStore + ProcessGroupGloo in this process).
#include "shardpoint/communicator_from_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/tcp_communicator.h"
#include "launch_ranks.h"
#include "shardpoint/error.h"
#ifdef SP_HAVE_GLOO
#include "comm/gloo_communicator.h"
#endif

namespace shardpoint::comm {
namespace {

using ::testing::HasSubstr;

// Clears the launcher variables for the test and restores them afterwards.
class CommEnvTest : public ::testing::Test {
 protected:
  static constexpr const char* kNames[] = {"RANK",       "WORLD_SIZE",         "MASTER_ADDR",          "MASTER_PORT",
                                           "LOCAL_RANK", "GLOO_SOCKET_IFNAME", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                           "PMIX_RANK",  "SHARDPOINT_COMM"};
  void SetUp() override {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(CommEnvTest, NoLauncherMeansSingle) {
  EXPECT_EQ(comm_driver_from_env(), CommDriver::kSingle);
  auto comm = make_communicator_from_env();
  EXPECT_EQ(comm->name(), "single");
  EXPECT_EQ(comm->world_size(), 1);
}

TEST_F(CommEnvTest, TorchrunVariablesMeanGloo) {
  ::setenv("RANK", "0", 1);
  EXPECT_EQ(comm_driver_from_env(), CommDriver::kSingle) << "RANK alone is not enough";
  ::setenv("WORLD_SIZE", "2", 1);
  EXPECT_EQ(comm_driver_from_env(), CommDriver::kGloo);
}

TEST_F(CommEnvTest, MpirunWinsOverTorchrunVariables) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  EXPECT_TRUE(launched_by_mpirun());
  EXPECT_EQ(comm_driver_from_env(), CommDriver::kMpi);
}

TEST_F(CommEnvTest, SHARDPOINT_COMMPicksTheDriver) {
  ::setenv("SHARDPOINT_COMM", "tcp", 1);
  EXPECT_EQ(comm_driver_from_env(), CommDriver::kTcp);
  ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  EXPECT_EQ(comm_driver_from_env(), CommDriver::kTcp) << "the explicit choice wins over mpirun";
  ::setenv("SHARDPOINT_COMM", "single", 1);
  EXPECT_EQ(comm_driver_from_env(), CommDriver::kSingle);
  ::setenv("SHARDPOINT_COMM", "gloo", 1);
  EXPECT_EQ(comm_driver_from_env(), CommDriver::kGloo);
  ::setenv("SHARDPOINT_COMM", "mpi", 1);
  EXPECT_EQ(comm_driver_from_env(), CommDriver::kMpi);
  ::setenv("SHARDPOINT_COMM", "Gloo", 1);
  EXPECT_THAT([] { comm_driver_from_env(); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr("SHARDPOINT_COMM=\"Gloo\": expected single, tcp")));
}

TEST_F(CommEnvTest, TcpWorldOfOneInThisProcess) {
  ::setenv("SHARDPOINT_COMM", "tcp", 1);
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  auto comm = make_communicator_from_env({.timeout = std::chrono::seconds(30)});
  EXPECT_EQ(comm->name(), "tcp");
  EXPECT_EQ(comm->world_size(), 1);
  comm->barrier();
  EXPECT_EQ(comm->broadcast(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(comm->gather("g"), std::vector<std::string>{"g"});
  EXPECT_EQ(comm->all_gather(""), std::vector<std::string>{""});
  EXPECT_EQ(comm->scatter({"s"}), "s");
  EXPECT_EQ(comm->all_reduce(std::int64_t{-3}, ReduceOp::kMin), -3);
  EXPECT_DOUBLE_EQ(comm->all_reduce(1.25, ReduceOp::kSum), 1.25);
}

TEST_F(CommEnvTest, TcpOptionsFromEnv) {
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  ::setenv("MASTER_PORT", "23456", 1);
  TcpOptions o = tcp_options_from_env({.timeout = std::chrono::seconds(9)});
  EXPECT_EQ(o.rank, 2);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.master_addr, "10.0.0.7");
  EXPECT_EQ(o.master_port, 23456);
  EXPECT_EQ(o.init_timeout, std::chrono::seconds(9));
  ::setenv("MASTER_PORT", "0", 1);
  EXPECT_THAT([] { tcp_options_from_env(); }, ::testing::ThrowsMessage<UsageError>(HasSubstr("MASTER_PORT=\"0\"")));
  ::unsetenv("RANK");
  EXPECT_THAT([] { tcp_options_from_env(); }, ::testing::ThrowsMessage<UsageError>(HasSubstr("RANK is not set")));
}

TEST_F(CommEnvTest, TcpJoinFailureIsACommErrorNamingTheAddress) {
  TcpOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.master_port = testing::pick_free_port();
  o.init_timeout = std::chrono::milliseconds(500);
  EXPECT_THAT([&] { make_tcp_communicator(o); },
              ::testing::ThrowsMessage<CommError>(HasSubstr("tcp rank 1/2: joining the group at 127.0.0.1:" +
                                                            std::to_string(o.master_port) + ": rank 0 not reachable")));
}

TEST_F(CommEnvTest, DriverAvailability) {
  EXPECT_TRUE(comm_driver_available(CommDriver::kSingle));
  EXPECT_TRUE(comm_driver_available(CommDriver::kTcp));
#ifdef SP_HAVE_GLOO
  EXPECT_TRUE(comm_driver_available(CommDriver::kGloo));
#else
  EXPECT_FALSE(comm_driver_available(CommDriver::kGloo));
#endif
}

#ifdef SP_HAVE_GLOO
TEST_F(CommEnvTest, GlooOptionsFromEnv) {
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  ::setenv("MASTER_PORT", "23456", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  ::setenv("GLOO_SOCKET_IFNAME", "lo", 1);
  GlooOptions o = gloo_options_from_env({.timeout = std::chrono::seconds(9)});
  EXPECT_EQ(o.rank, 2);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.master_addr, "10.0.0.7");
  EXPECT_EQ(o.master_port, 23456);
  EXPECT_EQ(o.local_rank, 0);
  EXPECT_EQ(o.interface, "lo");
  EXPECT_EQ(o.comm.timeout, std::chrono::seconds(9));

  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  ::unsetenv("LOCAL_RANK");
  o = gloo_options_from_env();
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.local_rank, -1);
}

TEST_F(CommEnvTest, BadGlooEnvironmentIsAUsageErrorNamingTheVariable) {
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("RANK", "4", 1);
  EXPECT_THAT([] { gloo_options_from_env(); }, ::testing::ThrowsMessage<UsageError>(HasSubstr("RANK=4")));
  ::setenv("RANK", "one", 1);
  EXPECT_THAT([] { gloo_options_from_env(); }, ::testing::ThrowsMessage<UsageError>(HasSubstr("RANK=\"one\"")));
  ::setenv("RANK", "1", 1);
  ::setenv("MASTER_PORT", "70000", 1);
  EXPECT_THAT([] { make_communicator_from_env(); },
              ::testing::ThrowsMessage<UsageError>(HasSubstr("MASTER_PORT=\"70000\"")));
  ::unsetenv("WORLD_SIZE");
  EXPECT_THROW(gloo_options_from_env(), UsageError);
}

TEST_F(CommEnvTest, GlooWorldOfOneInThisProcess) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(testing::pick_free_port()).c_str(), 1);
  auto comm = make_communicator_from_env({.timeout = std::chrono::seconds(30)});
  EXPECT_EQ(comm->name(), "gloo");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  comm->barrier();
  EXPECT_EQ(comm->broadcast(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(comm->broadcast(""), "");
  EXPECT_EQ(comm->gather("g"), std::vector<std::string>{"g"});
  EXPECT_EQ(comm->all_gather(std::string(1 << 20, 'z')), std::vector<std::string>{std::string(1 << 20, 'z')});
  EXPECT_EQ(comm->scatter({"s"}), "s");
  EXPECT_EQ(comm->all_reduce(std::int64_t{-3}, ReduceOp::kMin), -3);
  EXPECT_DOUBLE_EQ(comm->all_reduce(1.25, ReduceOp::kSum), 1.25);
  EXPECT_TRUE(comm->all_ok(true));
}

TEST_F(CommEnvTest, GlooJoinFailureIsACommErrorNamingTheAddress) {
  // Rank 1 of 2 with nobody serving the store: connecting must fail within init_timeout.
  GlooOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.master_port = testing::pick_free_port();
  o.init_timeout = std::chrono::seconds(2);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT([&] { make_gloo_communicator(o); },
              ::testing::ThrowsMessage<CommError>(HasSubstr("127.0.0.1:" + std::to_string(o.master_port))));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}
#endif

}  // namespace
}  // namespace shardpoint::comm
