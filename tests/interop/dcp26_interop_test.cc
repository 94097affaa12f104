// Interop acceptance with real PyTorch 2.6 DCP, both directions:
//   - PyTorch 2.6 dcp.save on 3 gloo processes (tests/interop/dcp26.py) -> shardpoint
//     engine::load on 1, 2 and 4 ranks (interop_worker), every byte checked;
//   - PyTorch 2.6 dcp.save on 4 processes with a (2, 2) mesh -> shardpoint load on 3 ranks;
//   - shardpoint engine::save on 4 ranks -> PyTorch 2.6 dcp.load on 2 and 3 processes and
//     format_utils.dcp_to_torch_save, every value checked.
// Values are a function of (fqn, global index) (interop_values.h / dcp26.py), so every side
// recomputes what it must see. PyTorch runs through scripts/oracle-python (SP_REQUIRE_TORCH26:
// skipped without the oracle root, failed then under SHARDPOINT_REQUIRE_ORACLES=1).
// One checkpoint per direction is reused by all its loads (each PyTorch multi-process run
// costs several seconds of imports).
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "launch_ranks.h"
#include "test_util.h"

namespace shardpoint::testing {
namespace {

constexpr auto kTorchTimeout = std::chrono::seconds(300);
constexpr auto kRanksTimeout = std::chrono::seconds(180);
const std::string kScript = SP_SOURCE_DIR "/tests/interop/dcp26.py";

ProcessResult run_torch(const std::string& python, std::vector<std::string> args) {
  std::vector<std::string> argv{python, kScript};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, kTorchTimeout);
}

void expect_ranks_ok(const std::vector<ProcessResult>& ranks) {
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ": " << ranks[r].describe();
  }
}

TEST(Dcp26InteropTest, TorchSavesOn3RanksShardpointLoadsOn1_2_4) {
  SP_REQUIRE_TORCH26(python);
  TempDir dir;
  const std::string ckpt = dir.file("torch26");
  const std::string manifest = dir.file("torch26.expected.json");
  const ProcessResult saved = run_torch(python, {"save", ckpt, "--ws", "3", "--manifest", manifest});
  ASSERT_EQ(saved.exit_code, 0) << "PyTorch 2.6 save: " << saved.describe();
  ASSERT_TRUE(std::filesystem::is_regular_file(std::filesystem::path(ckpt) / ".metadata"));
  ASSERT_TRUE(std::filesystem::is_regular_file(manifest));

  for (int world : {1, 2, 4}) {
    SCOPED_TRACE("shardpoint load on " + std::to_string(world) + " ranks");
    LaunchOptions options;
    options.timeout = kRanksTimeout;
    expect_ranks_ok(launch_ranks(SP_INTEROP_WORKER, {"load", ckpt, "--expected", manifest}, world, options));
  }
}

// A real 2-D mesh needs 4 PyTorch ranks: model.m2d is [Shard(0), Shard(1)] over a (2, 2)
// mesh, so its 4 saved chunks each start inside both dimensions; 3 shardpoint ranks read
// them through boxes that cut every chunk.
TEST(Dcp26InteropTest, TorchSavesOn4RanksWith2x2MeshShardpointLoadsOn3) {
  SP_REQUIRE_TORCH26(python);
  TempDir dir;
  const std::string ckpt = dir.file("torch26");
  const std::string manifest = dir.file("torch26.expected.json");
  const ProcessResult saved = run_torch(python, {"save", ckpt, "--ws", "4", "--manifest", manifest});
  ASSERT_EQ(saved.exit_code, 0) << "PyTorch 2.6 save: " << saved.describe();
  LaunchOptions options;
  options.timeout = kRanksTimeout;
  expect_ranks_ok(launch_ranks(SP_INTEROP_WORKER, {"load", ckpt, "--expected", manifest}, 3, options));
}

TEST(Dcp26InteropTest, ShardpointSavesOn4RanksTorchLoadsOn2_3AndConverts) {
  SP_REQUIRE_TORCH26(python);
  TempDir dir;
  const std::string ckpt = dir.file("shardpoint");
  const std::string manifest = dir.file("shardpoint.expected.json");
  LaunchOptions options;
  options.timeout = kRanksTimeout;
  const auto saved = launch_ranks(SP_INTEROP_WORKER, {"save", ckpt, "--manifest", manifest}, 4, options);
  expect_ranks_ok(saved);
  ASSERT_FALSE(HasFailure()) << "shardpoint save failed";
  ASSERT_TRUE(std::filesystem::is_regular_file(std::filesystem::path(ckpt) / ".metadata"));
  ASSERT_TRUE(std::filesystem::is_regular_file(manifest));

  for (int world : {2, 3}) {
    const std::string ws = std::to_string(world);
    const ProcessResult loaded = run_torch(python, {"load", ckpt, "--ws", ws, "--expected", manifest});
    EXPECT_EQ(loaded.exit_code, 0) << "PyTorch 2.6 dcp.load on " << ws << " processes: " << loaded.describe();
    EXPECT_NE(loaded.output.find("dcp26 load ok: ws=" + ws), std::string::npos) << loaded.output;
  }
  const ProcessResult converted =
      run_torch(python, {"to_torch", ckpt, dir.file("consolidated.pt"), "--expected", manifest});
  EXPECT_EQ(converted.exit_code, 0) << "PyTorch 2.6 dcp_to_torch_save: " << converted.describe();
}

}  // namespace
}  // namespace shardpoint::testing
