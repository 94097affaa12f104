// save()/load() across real processes: engine_worker ranks over the Gloo communicator,
// saving on N and loading on M for every N, M in 1..4, and over the TCP one
// (SHARDPOINT_COMM=tcp) on a smaller matrix (the resharding is the engine's, the same on
// both; what differs is the communicator). Environment as tests/launch_ranks.h sets it. A
// process takes ~2 s just to start (LibTorch), so the jobs of one phase run side by side:
// the saves at once, then for each N its loads at once.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "launch_ranks.h"
#include "test_util.h"

namespace {

using shardpoint::testing::Command;
using shardpoint::testing::ProcessResult;

struct Job {
  std::string what;  // for messages
  int world = 1;
  std::vector<std::string> args;
};

// Runs every job's ranks at once, each job on its own master port; `env` goes to every rank.
void run_jobs(const std::vector<Job>& jobs, const shardpoint::testing::EnvVars& env = {}) {
  std::vector<Command> commands;
  std::vector<std::string> names;
  std::set<int> ports;
  for (const Job& job : jobs) {
    int port = shardpoint::testing::pick_free_port();
    while (ports.contains(port)) port = shardpoint::testing::pick_free_port();
    ports.insert(port);
    for (int r = 0; r < job.world; ++r) {
      Command cmd;
      cmd.argv.push_back(SP_ENGINE_WORKER);
      cmd.argv.insert(cmd.argv.end(), job.args.begin(), job.args.end());
      cmd.env = {{"RANK", std::to_string(r)},
                 {"LOCAL_RANK", std::to_string(r)},
                 {"WORLD_SIZE", std::to_string(job.world)},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", std::to_string(port)}};
      cmd.env.insert(cmd.env.end(), env.begin(), env.end());
      commands.push_back(std::move(cmd));
      names.push_back(job.what + ", rank " + std::to_string(r));
    }
  }
  const std::vector<ProcessResult> results = shardpoint::testing::run_processes(commands, std::chrono::seconds(120));
  for (std::size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].exit_code, 0) << names[i] << ": " << results[i].describe();
  }
}

// Saves on every N of `save_worlds`, then loads each on every M of `load_worlds`.
void save_on_n_load_on_m(const std::vector<int>& save_worlds, const std::vector<int>& load_worlds,
                         const shardpoint::testing::EnvVars& env) {
  shardpoint::testing::TempDir dir;
  auto ckpt = [&](int n) { return dir.file("n" + std::to_string(n)); };
  std::vector<Job> saves;
  saves.reserve(save_worlds.size());
  for (int n : save_worlds) saves.push_back({"save on " + std::to_string(n), n, {"save", ckpt(n)}});
  run_jobs(saves, env);
  if (::testing::Test::HasFailure()) return;
  for (int n : save_worlds) {
    std::vector<Job> loads;
    loads.reserve(load_worlds.size());
    for (int m : load_worlds) {
      loads.push_back({"save on " + std::to_string(n) + " -> load on " + std::to_string(m), m, {"load", ckpt(n)}});
    }
    run_jobs(loads, env);
  }
}

TEST(EngineProcessTest, SaveOnNLoadOnMGloo) { save_on_n_load_on_m({1, 2, 3, 4}, {1, 2, 3, 4}, {}); }

// Uneven shards (3 ranks) onto fewer, more and one rank, and 4 onto 3.
TEST(EngineProcessTest, SaveOnNLoadOnMTcp) {
  save_on_n_load_on_m({3}, {1, 2, 4}, {{"SHARDPOINT_COMM", "tcp"}});
  save_on_n_load_on_m({4}, {3}, {{"SHARDPOINT_COMM", "tcp"}});
}

}  // namespace
