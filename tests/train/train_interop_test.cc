// A sharded checkpoint written by shardpoint-train (2 ranks) loads with PyTorch 2.6 DCP into
// a Python nn.Transformer-based model with the demo's module names, and torch's
// dcp_to_torch_save consolidates it to the same tensors as `shardpoint consolidate`; a full
// checkpoint (optimizer state keyed by parameter id, as Lightning's) loads into
// torch.optim.Adam.
// Skipped without the oracle root (scripts/oracle-python); fails then under
// SHARDPOINT_REQUIRE_ORACLES=1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "launch_ranks.h"
#include "test_util.h"

namespace shardpoint::train {
namespace {

namespace fs = std::filesystem;

TEST(TrainInteropTest, ShardedCheckpointLoadsInPyTorch26) {
  SP_REQUIRE_TORCH26(python);
  const fs::path dir = fs::temp_directory_path() / ("sp_train_interop_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto r = testing::run_process({SP_TRAIN_BIN, "--devices", "2", "--state-dict-type", "sharded", "--max-steps", "2",
                                 "--optimizer", "adam", "--root", dir.string()},
                                {}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const fs::path ckpt = dir / "lightning_logs/version_0/checkpoints/epoch=0-step=2.ckpt";
  ASSERT_TRUE(fs::is_regular_file(ckpt / "meta.pt"));
  const std::string consolidated = (dir / "consolidated.pt").string();
  r = testing::run_process({SP_CLI_BIN, "consolidate", ckpt.string(), "--output-file", consolidated, "-q"}, {},
                           std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  r = testing::run_process({SP_TRAIN_BIN, "--devices", "2", "--max-steps", "2", "--optimizer", "adam", "--monitor",
                            "train_loss", "--root", (dir / "full").string()},
                           {}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const fs::path full = dir / "full/lightning_logs/version_0/checkpoints/epoch=0-step=2.ckpt";
  ASSERT_TRUE(fs::is_regular_file(full));
  const auto py = testing::run_command(python + " " + SP_SOURCE_DIR + "/tests/train/lightning26.py '" + ckpt.string() +
                                       "' '" + consolidated + "' '" + full.string() + "' 2>&1");
  EXPECT_EQ(py.exit_code, 0) << py.output;
  EXPECT_NE(py.output.find("ok"), std::string::npos) << py.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardpoint::train
