// Objects that hold tensors (DCP bytes items whose torch.save archive has storage records,
// docs/dcp-format.md §2.5) end to end against PyTorch 2.6, with two oracle starts for all
// cases (tests/cli/object_items_oracle.py): PyTorch saves a tuple (tensor, 'l2'), views of
// one storage, a SimpleNamespace holding a dict of tensors, a bf16 Parameter and a 3 MiB
// tensor with a view of it inside a nested dict; then
//   - `inspect` shows the tensors inside each object;
//   - `reshard` to 3 ranks writes every bytes item byte for byte as PyTorch wrote it, and
//     PyTorch's dcp.load gets the same objects (as does a torch.save file holding one);
//   - `consolidate` of the source and of the resharded folder each equal, after torch.load,
//     what dcp_to_torch_save gives for the same folder (structure, key order, types, views,
//     storage sharing, values).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "shardpoint/checkpoint.h"
#include "shardpoint/storage_registry.h"
#include "test_util.h"

namespace shardpoint {
namespace {

using shardpoint::testing::run_command;
using shardpoint::testing::TempDir;

const std::string kTool = SP_SHARDPOINT;
const std::string kOracle = std::string(SP_SOURCE_DIR) + "/tests/cli/object_items_oracle.py";

std::string q(const std::string& s) { return "'" + s + "'"; }

// fqn -> the bytes of its bytes item.
std::map<std::string, std::string> object_blobs(const std::string& dir) {
  auto st = storage::open_storage(dir);
  const format::Metadata md = engine::read_metadata(*st);
  std::map<std::string, std::string> out;
  for (const auto& [index, info] : md.storage_data) {
    if (index.offset) continue;
    std::ifstream in(dir + "/" + info.relative_path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_LE(info.offset + info.length, bytes.size()) << index.fqn;
    out[index.fqn] = bytes.substr(static_cast<std::size_t>(info.offset), static_cast<std::size_t>(info.length));
  }
  return out;
}

// `inspect --json --hash`: tensors with hashes, objects with their repr.
nlohmann::json inspect_json(const std::string& path) {
  auto r = run_command(kTool + " inspect --json --hash " + q(path));
  EXPECT_EQ(r.exit_code, 0) << path << ": " << r.output;
  return nlohmann::json::parse(r.output);
}

TEST(ObjectItemsTest, PyTorch26ObjectsHoldingTensorsSurviveReshardAndConsolidate) {
  SP_REQUIRE_TORCH26(oracle);
  TempDir tmp;
  const std::string src = tmp.file("pt"), file = tmp.file("ns.pt"), dst = tmp.file("sp3"), file_dst = tmp.file("ns2");
  auto saved = run_command(oracle + " " + q(kOracle) + " save " + q(src) + " " + q(file) + " 2>&1");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;

  // inspect: each object with its tensors, in DCP folders and torch.save files.
  auto listed = run_command(kTool + " inspect " + q(src) + " 2>&1");
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  for (const char* line : {"= (tensor(float32, [2]), 'l2')\n",
                           "= (tensor(float64, [3, 4]), tensor(float64, [2, 4]), tensor(float64, [4, 3]))\n",
                           "= types.SimpleNamespace(d={'t': tensor(int64, [3])}, name='x')\n",
                           "= (Parameter(bfloat16, [2], requires_grad=True), 3)\n",
                           "= (tensor(float32, [786432]), {'n': [tensor(float32, [4])]})\n", "= 7\n"}) {
    EXPECT_NE(listed.output.find(line), std::string::npos) << line << "\n" << listed.output;
  }
  auto file_listed = run_command(kTool + " inspect " + q(file) + " 2>&1");
  EXPECT_NE(file_listed.output.find("= types.SimpleNamespace(d={'t': tensor(int64, [3])}, name='x')\n"),
            std::string::npos)
      << file_listed.output;

  // reshard: PyTorch's blobs come out unchanged; inspect sees the same checkpoint.
  auto r = run_command(kTool + " reshard -q " + q(src) + " " + q(dst) + " --ranks 3 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto before = object_blobs(src), after = object_blobs(dst);
  EXPECT_EQ(before.size(), 6u);
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [fqn, blob] : before) EXPECT_TRUE(after.at(fqn) == blob) << fqn << ": item bytes differ";
  EXPECT_EQ(inspect_json(dst), inspect_json(src));
  r = run_command(kTool + " reshard -q " + q(file) + " " + q(file_dst) + " --ranks 2 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // consolidate the source and the resharded folder.
  const std::string out1 = tmp.file("pt.pt"), out2 = tmp.file("sp3.pt");
  for (const auto& [folder, out] : {std::pair{src, out1}, std::pair{dst, out2}}) {
    auto c = run_command(kTool + " consolidate -q --layout dcp " + q(folder) + " --output " + q(out) + " 2>&1");
    ASSERT_EQ(c.exit_code, 0) << folder << ": " << c.output;
  }

  auto checked = run_command(oracle + " " + q(kOracle) + " check " + q(dst) + " " + q(file_dst) + " " +
                             q(src + "=" + out1) + " " + q(dst + "=" + out2) + " 2>&1");
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

}  // namespace
}  // namespace shardpoint
