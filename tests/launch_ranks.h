// Multi-process test helpers: start processes (the ranks of a job, or a launcher like mpirun),
// capture their stdout+stderr, and kill whatever is still running at the timeout, so a hung
// rank fails the test instead of hanging ctest.
//
//   auto ranks = launch_ranks(SP_BINARY_DIR "/tests/comm/comm_worker", {"collectives"}, 4);
//   for (const auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << r.describe();
//
//   ProcessResult mpi = run_process({"mpirun", "-np", "4", worker, "collectives"},
//                                   mpirun_root_env(), std::chrono::seconds(120));
//
// The launching itself is src/comm/launch.h, the same code `shardpoint-train --devices N` uses
// (torchrun's variables, a reserved MASTER_PORT, the retry on "Address already in use"); this
// header only sets the test defaults: output captured, each process in its own process group
// (the whole group gets SIGKILL at the timeout), 120 s for a job.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/launch.h"

namespace shardpoint::testing {

using comm::Command;
using comm::EnvVars;
using comm::ProcessResult;

struct LaunchOptions : comm::LaunchOptions {
  LaunchOptions() { timeout = std::chrono::seconds(120); }  // for the whole job
};

// A port in [21000, 28999] reserved (comm::reserve_port) until this test process exits, for
// tests that start the ranks themselves.
inline int pick_free_port() {
  static std::mutex mutex;
  static std::vector<comm::PortReservation> held;
  std::lock_guard<std::mutex> lock(mutex);
  held.push_back(comm::reserve_port());
  return held.back().port();
}

// Runs all commands at once and waits for all of them, at most `timeout` in total; processes
// still running then are killed (their whole process group). Results are in command order.
inline std::vector<ProcessResult> run_processes(const std::vector<Command>& commands,
                                                std::chrono::milliseconds timeout) {
  comm::RunOptions options;
  options.timeout = timeout;
  return comm::run_processes(commands, options);
}

inline ProcessResult run_process(std::vector<std::string> argv, EnvVars env, std::chrono::milliseconds timeout) {
  return run_processes({Command{std::move(argv), std::move(env)}}, timeout).front();
}

// Starts `world_size` copies of `binary args...` as ranks 0..world_size-1 with torchrun's
// environment, waits for all (killing stragglers at the timeout). Results indexed by rank.
inline std::vector<ProcessResult> launch_ranks(const std::string& binary, const std::vector<std::string>& args,
                                               int world_size, const LaunchOptions& options = {}) {
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  return comm::launch_ranks(argv, world_size, options);
}

// The environment OpenMPI's mpirun needs here: running as root, and more ranks than cores.
inline EnvVars mpirun_root_env() {
  return {{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
          {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
          {"OMPI_MCA_rmaps_base_oversubscribe", "1"}};
}

}  // namespace shardpoint::testing
