// The cases every torchrun-style communicator driver passes across real processes (comm_worker
// ranks started by launch_ranks), parameterized over the driver. A driver's test file
// instantiates them and links multi_process_cases.cc:
//
//   INSTANTIATE_TEST_SUITE_P(Tcp, MultiProcessCommTest,
//                            ::testing::Values(CommDriverUnderTest{"tcp", SP_COMM_WORKER_TCP}),
//                            CommDriverName());
//
// Driver-specific behaviour (the TCP star's own errors, the MPI launcher) stays in the
// driver's file, which uses the helpers below too.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

#include "launch_ranks.h"

namespace shardpoint::testing {

struct CommDriverUnderTest {
  std::string name;    // as the driver names itself: "tcp" in "collectives ok (tcp, world 4)"
  std::string worker;  // the comm_worker binary that picks this driver from the environment
  EnvVars env = {};    // extra variables for every rank (e.g. SHARDPOINT_COMM)
  // What the survivors of a dead rank 3 say beyond "<name> rank R/4: barrier failed after"
  // ("" when nothing more is promised).
  std::string dead_rank_detail = "";
  // What rank 0 says when rank 3 is slow ("" when nothing more is promised).
  std::string slow_rank_detail_on_rank0 = "";
};

// What gtest prints for GetParam() (the ctest name would otherwise carry a byte dump).
inline void PrintTo(const CommDriverUnderTest& driver, std::ostream* os) { *os << driver.name; }

class MultiProcessCommTest : public ::testing::TestWithParam<CommDriverUnderTest> {};

struct CommDriverName {
  std::string operator()(const ::testing::TestParamInfo<CommDriverUnderTest>& info) const { return info.param.name; }
};

// Launch options with a kill timeout for the whole job and extra variables for every rank.
inline LaunchOptions with_timeout(std::chrono::seconds timeout, EnvVars env = {}) {
  LaunchOptions options;
  options.timeout = timeout;
  options.env = std::move(env);
  return options;
}

// Every rank's result, for a failure message.
inline std::string all_outputs(const std::vector<ProcessResult>& results) {
  std::string out;
  for (std::size_t r = 0; r < results.size(); ++r)
    out += "--- rank " + std::to_string(r) + ": " + results[r].describe();
  return out;
}

// Runs comm_worker's "collectives" scenario on `world` ranks of `driver` and expects every
// rank to report success under the driver's name.
void expect_collectives_ok(const CommDriverUnderTest& driver, int world, std::chrono::seconds timeout);

}  // namespace shardpoint::testing
