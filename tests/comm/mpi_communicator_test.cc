// MPI driver across real processes: comm_worker under `mpirun -np 4` (as root, oversubscribed:
// tests/launch_ranks.h mpirun_root_env()).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "launch_ranks.h"

namespace shardpoint::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

const std::string kWorker = SP_COMM_WORKER;

ProcessResult mpirun(int np, std::vector<std::string> worker_args, std::chrono::milliseconds timeout) {
  std::vector<std::string> argv = {SP_MPIEXEC, "-np", std::to_string(np), kWorker};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  EnvVars env = mpirun_root_env();
  // A torchrun environment inherited from outside must not matter: mpirun wins.
  env.push_back({"RANK", "0"});
  env.push_back({"WORLD_SIZE", "1"});
  // Under AddressSanitizer, OpenMPI's own allocations are reported as leaks at exit.
  const char* asan = std::getenv("ASAN_OPTIONS");
  env.push_back({"ASAN_OPTIONS", std::string(asan ? asan : "") + (asan && *asan ? ":" : "") + "detect_leaks=0"});
  return run_process(argv, env, timeout);
}

TEST(MpiCommunicatorTest, CollectivesAcrossFourProcesses) {
  ProcessResult r = mpirun(4, {"collectives"}, 180s);
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(r.output, HasSubstr("rank " + std::to_string(rank) + ": collectives ok (mpi, world 4)"));
  }
}

TEST(MpiCommunicatorTest, SlowRankMakesTheOthersTimeOut) {
  // Ranks 0-2 time out after 1 s and leave without MPI_Finalize; mpirun then ends the job.
  ProcessResult r = mpirun(4, {"slow", "--timeout-ms", "1000"}, 120s);
  EXPECT_FALSE(r.timed_out) << r.describe();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_THAT(r.output, HasSubstr("rank " + std::to_string(rank) + ": got CommError"));
  }
  EXPECT_THAT(r.output, HasSubstr("(timeout 1 s): timed out; the posted MPI collective cannot be cancelled"));
}

TEST(MpiCommunicatorTest, DeadRankEndsTheJobNotAHang) {
  // Under mpirun a rank that dies takes the job down (the others may not get to report).
  ProcessResult r = mpirun(4, {"die", "--timeout-ms", "30000"}, 120s);
  EXPECT_FALSE(r.timed_out) << r.describe();
  EXPECT_NE(r.exit_code, 0) << r.describe();
  EXPECT_THAT(r.output, HasSubstr("rank 3: dying"));
  EXPECT_LT(r.seconds, 60.0) << r.describe();
}

}  // namespace
}  // namespace shardpoint::testing
