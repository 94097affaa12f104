// `shardpoint inspect` end to end: the JSON contract, hashes equal to PyTorch's for the
// same tensors (whatever their strides), the same keys and hashes for a torch.save file
// and a DCP folder of the same state, and the error contract (one line, exit 1/2).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace shardpoint {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kShardpoint = SP_SHARDPOINT;

nlohmann::json inspect_json(const std::string& path) {
  auto r = run_command(kShardpoint + " inspect --json --hash '" + path + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

// PyTorch 1.13 writes views, strided and shared tensors; the hashes shardpoint reports
// must equal sha256(t.contiguous() bytes) computed by PyTorch.
TEST(InspectCli, TorchFileHashesMatchPyTorch) {
  SP_REQUIRE_TORCH113(python);
  TempDir dir;
  const std::string file = dir.file("state.pt"), expected = dir.file("expected.json");
  testing::write_text(dir.file("make.py"), R"PY(
import collections, hashlib, json, sys, torch
base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
sd = {
  "model": collections.OrderedDict(w=base, wt=base.t(), row=base[1], b=torch.ones(3, dtype=torch.bfloat16)),
  "opt": {"state": {0: {"step": torch.tensor(7.0)}}, "param_groups": [{"lr": 0.5, "params": [0]}]},
  "ints": torch.arange(5, dtype=torch.int64)[::2],
  "epoch": 3, "name": "caf\u00e9",
}
torch.save(sd, sys.argv[1])
def h(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16: t = t.view(torch.int16)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()
out = {"model.w": h(base), "model.wt": h(base.t()), "model.row": h(base[1]), "model.b": h(torch.ones(3, dtype=torch.bfloat16)),
       "opt.state.0.step": h(torch.tensor(7.0)), "ints": h(torch.arange(5)[::2])}
json.dump(out, open(sys.argv[2], "w"))
)PY");
  auto made = run_command(python + " " + dir.file("make.py") + " " + file + " " + expected + " 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  nlohmann::json got = inspect_json(file);
  nlohmann::json want = nlohmann::json::parse(testing::read_text(expected));
  EXPECT_EQ(got["format"], "torch");
  for (auto& [key, hash] : want.items()) {
    ASSERT_TRUE(got["tensors"].contains(key)) << key << " in " << got.dump();
    EXPECT_EQ(got["tensors"][key]["sha256"], hash) << key;
  }
  EXPECT_EQ(got["tensors"]["model.wt"]["shape"], nlohmann::json({6, 4}));
  EXPECT_EQ(got["tensors"]["model.b"]["dtype"], "bfloat16");
  EXPECT_EQ(got["tensors"]["opt.state.0.step"]["shape"], nlohmann::json::array());
  EXPECT_EQ(got["objects"]["epoch"], "3");
  EXPECT_EQ(got["objects"]["name"], "'caf\u00e9'");
  EXPECT_EQ(got["objects"]["opt.param_groups.0.lr"], "0.5");
  EXPECT_EQ(got["objects"]["opt.param_groups.0.params"], "[0]");
}

// The same state as a torch.save file and as a DCP folder (reshard --ranks 3) inspects to
// the same JSON, and the human listing shows the chunk layout per file.
TEST(InspectCli, DcpFolderMatchesTorchFile) {
  SP_REQUIRE_TORCH113(python);
  TempDir dir;
  const std::string file = dir.file("state.pt");
  auto made = run_command(python +
                          " -c \"import torch; torch.save({'w': torch.arange(30.).reshape(10, 3), "
                          "'v': torch.arange(7, dtype=torch.int32), 'step': 4}, '" +
                          file + "')\" 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto resharded = run_command(kShardpoint + " reshard '" + file + "' '" + dir.file("ckpt") + "' --ranks 3 2>&1");
  ASSERT_EQ(resharded.exit_code, 0) << resharded.output;
  nlohmann::json a = inspect_json(file), b = inspect_json(dir.file("ckpt"));
  EXPECT_EQ(b["format"], "dcp");
  EXPECT_EQ(a["tensors"], b["tensors"]);
  EXPECT_EQ(a["objects"], b["objects"]);
  auto human = run_command(kShardpoint + " inspect '" + dir.file("ckpt") + "'");
  ASSERT_EQ(human.exit_code, 0);
  EXPECT_NE(human.output.find("__0_0.distcp"), std::string::npos) << human.output;
  EXPECT_NE(human.output.find("[4:8, 0:3]"), std::string::npos) << human.output;
}

TEST(InspectCli, ErrorsAreOneLineWithExitCodes) {
  TempDir dir;
  auto missing = run_command(kShardpoint + " inspect '" + dir.file("nope.pt") + "' 2>&1");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("shardpoint: "), std::string::npos);
  EXPECT_NE(missing.output.find("nope.pt"), std::string::npos);
  EXPECT_EQ(std::count(missing.output.begin(), missing.output.end(), '\n'), 1) << missing.output;

  testing::write_text(dir.file("garbage.pt"), std::string(1000, 'x'));
  auto garbage = run_command(kShardpoint + " inspect '" + dir.file("garbage.pt") + "' 2>&1");
  EXPECT_EQ(garbage.exit_code, 1);
  EXPECT_NE(garbage.output.find("garbage.pt"), std::string::npos) << garbage.output;

  auto usage = run_command(kShardpoint + " inspect --frobnicate x 2>&1");
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
  auto no_command = run_command(kShardpoint + " 2>&1");
  EXPECT_EQ(no_command.exit_code, 2) << no_command.output;

  // A legacy (pre-1.6) torch.save file is refused with a message saying so.
  std::string legacy("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);
  testing::write_text(dir.file("legacy.pt"), legacy + std::string(100, '\0'));
  auto old = run_command(kShardpoint + " inspect '" + dir.file("legacy.pt") + "' 2>&1");
  EXPECT_EQ(old.exit_code, 1);
  EXPECT_NE(old.output.find("legacy"), std::string::npos) << old.output;
}

TEST(InspectCli, ClosedStdoutEndsQuietly) {
  // `head -c 1` closes the pipe after one byte; shardpoint must end without an error line.
  SP_REQUIRE_TORCH113(python);
  TempDir dir;
  const std::string file = dir.file("big.pt");
  auto made = run_command(python + " -c \"import torch; torch.save({str(i): torch.zeros(1) for i in range(3000)}, '" +
                          file + "')\" 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto r = run_command(kShardpoint + " inspect '" + file + "' 2>" + dir.file("err") + " | head -c 1");
  EXPECT_EQ(r.output.size(), 1u);
  EXPECT_EQ(testing::read_text(dir.file("err")), "");
}

}  // namespace
}  // namespace shardpoint
