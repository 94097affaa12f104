// save()/load() across real processes: engine_worker ranks over the Gloo communicator
// (tests/launch_ranks.h), saving on N and loading on M for every N, M in 1..4.
#include <gtest/gtest.h>

#include <string>

#include "launch_ranks.h"
#include "test_util.h"

namespace {

using shardpoint::testing::launch_ranks;

TEST(EngineProcessTest, SaveOnNLoadOnMGloo) {
  shardpoint::testing::TempDir dir;
  shardpoint::testing::LaunchOptions options;
  options.timeout = std::chrono::seconds(120);
  for (int n = 1; n <= 4; ++n) {
    const std::string ckpt = dir.file("n" + std::to_string(n));
    auto saved = launch_ranks(SP_ENGINE_WORKER, {"save", ckpt}, n, options);
    for (int r = 0; r < n; ++r) ASSERT_EQ(saved[r].exit_code, 0) << "save n=" << n << " rank " << r << ": " << saved[r].describe();
    for (int m = 1; m <= 4; ++m) {
      auto loaded = launch_ranks(SP_ENGINE_WORKER, {"load", ckpt}, m, options);
      for (int r = 0; r < m; ++r) {
        EXPECT_EQ(loaded[r].exit_code, 0) << "save " << n << " -> load " << m << ", rank " << r << ": "
                                          << loaded[r].describe();
      }
    }
  }
}

}  // namespace
