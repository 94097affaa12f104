// `shardpoint reshard` end to end: torch.save -> DCP (1 and 3 ranks), DCP on 3 ranks -> 4,
// checked with `inspect --json --hash` (same tensors, same hashes, same objects), with the
// engine's own load (values exact on 2 ranks), with the Shard(0) layout of .metadata, with
// PyTorch 2.6 loading the result (oracle), the CLI's error and usage exits, and peak RSS
// under --memory-budget (streaming) for a checkpoint larger than the budget.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "comm/thread_communicator.h"
#include "core/byte_stream.h"
#include "engine/checkpoint_test_state.h"
#include "engine/chunking.h"
#include "engine/torch_save.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/reshard.h"
#include "shardpoint/storage_registry.h"
#include "test_util.h"

namespace shardpoint {
namespace {

using shardpoint::testing::run_command;
using shardpoint::testing::TempDir;

const std::string kTool = SP_SHARDPOINT;

std::string q(const std::string& s) { return "'" + s + "'"; }

// `inspect --json --hash` without the "format" field (torch vs dcp), as a comparable value.
nlohmann::json inspect(const std::string& path) {
  auto r = run_command(kTool + " inspect --json --hash " + q(path));
  EXPECT_EQ(r.exit_code, 0) << path;
  nlohmann::json j = nlohmann::json::parse(r.output);  // unordered: key order may differ
  j.erase("format");
  return j;
}

// Saves the engine test state on `world` in-process ranks into dir.
void save_engine_state(const std::string& dir, int world) {
  auto st = storage::open_storage(dir);
  std::vector<engine::testing::RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(engine::testing::make_rank_state(r, world, true));
  comm::ThreadGroup group(world, comm::CommOptions{std::chrono::seconds(30)});
  group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });
}

// Loads dir on `world` in-process ranks and returns the first mismatch ("" when exact).
std::string load_engine_state(const std::string& dir, int world) {
  auto st = storage::open_storage(dir);
  std::vector<engine::testing::RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(engine::testing::make_rank_state(r, world, false));
  comm::ThreadGroup group(world, comm::CommOptions{std::chrono::seconds(30)});
  group.run([&](comm::Communicator& comm) { engine::load(states[comm.rank()].root, *st, comm); });
  for (int r = 0; r < world; ++r) {
    std::string diff = engine::testing::compare_with_expected(states[r], r, world);
    if (!diff.empty()) return "rank " + std::to_string(r) + ": " + diff;
  }
  return "";
}

// A torch.save file of the whole engine test state (what a 1-rank job holds).
void write_torch_file(const std::string& path) {
  engine::testing::RankState full = engine::testing::make_rank_state(0, 1, true);
  StringSink sink;
  engine::write_torch_save(full.root, sink);
  shardpoint::testing::write_text(path, sink.str());
}

// Every tensor with dimensions has the Shard(0) chunks of `world` ranks (the non-empty
// ones); 0-dim tensors and the `replicated` ones have one chunk covering them whole.
void expect_dim0_layout(const std::string& dir, int world, const std::set<std::string>& replicated = {}) {
  auto st = storage::open_storage(dir);
  format::Metadata md = engine::read_metadata(*st);
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    const auto* t = std::get_if<format::TensorStorageMetadata>(&entry);
    if (t == nullptr) continue;
    if (t->size.empty() || replicated.count(fqn) != 0) {
      ASSERT_EQ(t->chunks.size(), 1u) << fqn;
      EXPECT_EQ(t->chunks[0].sizes, t->size) << fqn;
      continue;
    }
    std::set<std::pair<format::Shape, format::Shape>> want, got;
    for (auto& [o, s] : engine::shard_boxes(t->size, {world}, {engine::Placement::shard(0)})) {
      if (engine::volume(s) > 0) want.insert({o, s});
    }
    for (const auto& c : t->chunks) {
      if (engine::volume(c.sizes) > 0) got.insert({c.offsets, c.sizes});
    }
    EXPECT_EQ(got, want) << fqn;
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/__" + std::to_string(r) + "_0.distcp")) << r;
  }
}

TEST(ReshardTest, TorchSaveToDcpOnOneRankKeepsEveryTensorAndObject) {
  TempDir tmp;
  std::string src = tmp.file("full.pt"), dst = tmp.file("dcp");
  write_torch_file(src);
  auto r = run_command(kTool + " reshard " + q(src) + " " + q(dst) + " --ranks 1 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dst + "/.metadata"));
  EXPECT_TRUE(std::filesystem::exists(dst + "/__0_0.distcp"));
  nlohmann::json before = inspect(src), after = inspect(dst);
  EXPECT_FALSE(before["tensors"].empty());
  EXPECT_EQ(after, before);
  EXPECT_EQ(load_engine_state(dst, 2), "");
}

TEST(ReshardTest, TorchSaveToThreeRanksShardsOnDimZero) {
  TempDir tmp;
  std::string src = tmp.file("full.pt"), dst = tmp.file("dcp3");
  write_torch_file(src);
  auto r = run_command(kTool + " reshard -q " + q(src) + " " + q(dst) + " --ranks 3 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
  expect_dim0_layout(dst, 3);
  EXPECT_EQ(inspect(dst), inspect(src));
  EXPECT_EQ(load_engine_state(dst, 4), "");
}

TEST(ReshardTest, DcpOnThreeRanksToFourKeepsHashes) {
  TempDir tmp;
  std::string src = tmp.file("saved3"), dst = tmp.file("saved4");
  save_engine_state(src, 3);
  auto r = run_command(kTool + " reshard " + q(src) + " " + q(dst) + " --ranks 4 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The replicated tensor of a sharded source stays whole, written once.
  expect_dim0_layout(dst, 4, {"model.rep"});
  EXPECT_EQ(inspect(dst), inspect(src));
  EXPECT_EQ(load_engine_state(dst, 2), "");
  EXPECT_EQ(load_engine_state(dst, 3), "");
}

// The flags are the options' names everywhere (ReshardOptions, the C API, Python); the
// older spellings still work.
TEST(ReshardTest, OptionNamesAndTheirOlderSpellings) {
  TempDir tmp;
  std::string src = tmp.file("full.pt");
  write_torch_file(src);
  auto named = run_command(kTool + " reshard -q " + q(src) + " " + q(tmp.file("named")) +
                           " --ranks 2 --thread-count 2 --memory-budget-bytes 8MiB --parallel-files 2"
                           " --no-verify-checksums --compression zstd --compression-level 5 2>&1");
  ASSERT_EQ(named.exit_code, 0) << named.output;
  auto older = run_command(kTool + " reshard -q " + q(src) + " " + q(tmp.file("older")) +
                           " --ranks 2 --threads 2 --memory-budget 8MiB --parallel 2 --no-verify --compress zstd"
                           " --compress-level 5 2>&1");
  ASSERT_EQ(older.exit_code, 0) << older.output;
  EXPECT_EQ(inspect(tmp.file("named")), inspect(src));
  EXPECT_EQ(inspect(tmp.file("older")), inspect(src));
  auto small = run_command(kTool + " reshard " + q(src) + " " + q(tmp.file("small")) +
                           " --ranks 2 --memory-budget-bytes 1KiB 2>&1");
  EXPECT_EQ(small.exit_code, 2);
  EXPECT_NE(small.output.find("--memory-budget-bytes must be at least"), std::string::npos) << small.output;
}

TEST(ReshardTest, EmptyDestinationFolderIsAccepted) {
  TempDir tmp;
  std::string src = tmp.file("full.pt"), dst = tmp.file("empty");
  write_torch_file(src);
  std::filesystem::create_directory(dst);
  auto r = run_command(kTool + " reshard -q " + q(src) + " " + q(dst) + " --ranks 2 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(inspect(dst), inspect(src));
}

TEST(ReshardTest, ErrorsAreOneLineAndUsageExitsTwo) {
  TempDir tmp;
  std::string src = tmp.file("full.pt"), dst = tmp.file("busy");
  write_torch_file(src);
  std::filesystem::create_directory(dst);
  shardpoint::testing::write_text(dst + "/keep.txt", "x");

  auto busy = run_command(kTool + " reshard " + q(src) + " " + q(dst) + " --ranks 2 2>&1");
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_NE(busy.output.find("not empty"), std::string::npos) << busy.output;
  EXPECT_EQ(std::count(busy.output.begin(), busy.output.end(), '\n'), 1) << busy.output;
  EXPECT_EQ(shardpoint::testing::read_text(dst + "/keep.txt"), "x");

  auto missing =
      run_command(kTool + " reshard " + q(tmp.file("nope.pt")) + " " + q(tmp.file("o1")) + " --ranks 2 2>&1");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.output.rfind("shardpoint: ", 0), 0u) << missing.output;
  EXPECT_EQ(std::count(missing.output.begin(), missing.output.end(), '\n'), 1) << missing.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("o1") + "/.metadata"));

  // Not a checkpoint: a file of garbage.
  shardpoint::testing::write_text(tmp.file("junk.pt"), "not a zip file at all");
  auto junk = run_command(kTool + " reshard " + q(tmp.file("junk.pt")) + " " + q(tmp.file("o2")) + " --ranks 1 2>&1");
  EXPECT_EQ(junk.exit_code, 1) << junk.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("o2") + "/.metadata"));

  EXPECT_EQ(run_command(kTool + " reshard " + q(src) + " " + q(tmp.file("o3")) + " --ranks 0 2>/dev/null").exit_code,
            2);
  EXPECT_EQ(run_command(kTool + " reshard " + q(src) + " 2>/dev/null").exit_code, 2);
  EXPECT_EQ(run_command(kTool + " reshard " + q(src) + " " + q(tmp.file("o4")) + " 2>/dev/null").exit_code, 2);

  auto help = run_command(kTool + " reshard --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("Memory:"), std::string::npos);
  EXPECT_NE(help.output.find("--ranks"), std::string::npos);
}

// PyTorch 1.13 writes the source: OrderedDict, int keys, a transposed (strided) tensor, a
// view into a shared storage, a tuple of tensors.
TEST(ReshardTest, TorchSaveFromPyTorchWithStridedTensors) {
  SP_REQUIRE_TORCH113(python);
  TempDir tmp;
  std::string src = tmp.file("pt.pt"), dst = tmp.file("dcp");
  const std::string script = "import sys, torch, collections\n"
                             "base = torch.arange(60, dtype=torch.float32).reshape(6, 10)\n"
                             "sd = {'model': collections.OrderedDict([('w', base.t()), ('v', base[2:5]), ('b', "
                             "torch.arange(5, dtype=torch.int64)),"
                             " ('h', torch.ones(7, 3, dtype=torch.float16)), ('s', torch.tensor(2.5))]),"
                             " 'optim': {'state': {0: {'step': torch.tensor(3.0), 'exp_avg': torch.full((9, 2), 0.5)}},"
                             " 'param_groups': [{'lr': 0.1, 'params': [0]}]},"
                             " 'pair': (torch.zeros(3), torch.ones(2, 2)), 'empty': torch.zeros(0, 4), 'epoch': 5}\n"
                             "torch.save(sd, sys.argv[1])\n";
  shardpoint::testing::write_text(tmp.file("make.py"), script);
  ASSERT_EQ(run_command(python + " " + q(tmp.file("make.py")) + " " + q(src)).exit_code, 0);
  auto r = run_command(kTool + " reshard -q " + q(src) + " " + q(dst) + " --ranks 4 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_dim0_layout(dst, 4);
  EXPECT_EQ(inspect(dst), inspect(src));
}

// PyTorch 2.6 saves on 3 ranks (Shard(0), Shard(1), a 2-D mesh, replicated, 0-dim,
// objects); reshard to 4; PyTorch loads it on 2 and 4 ranks with exact values.
TEST(ReshardTest, PyTorch26LoadsTheReshardedFolder) {
  SP_REQUIRE_TORCH26(oracle);
  TempDir tmp;
  std::string src = tmp.file("pt3"), dst = tmp.file("sp4"), manifest = tmp.file("manifest.json");
  const std::string dcp26 = std::string(SP_SOURCE_DIR) + "/tests/interop/dcp26.py";
  auto saved = run_command(oracle + " " + q(dcp26) + " save " + q(src) + " --ws 3 --manifest " + q(manifest) + " 2>&1");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  auto r = run_command(kTool + " reshard " + q(src) + " " + q(dst) + " --ranks 4 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_dim0_layout(dst, 4, {"model.rep", "model.ids"});  // plain tensors: replicated
  EXPECT_EQ(inspect(dst), inspect(src));
  for (int ws : {2, 4}) {
    auto loaded = run_command(oracle + " " + q(dcp26) + " load " + q(dst) + " --ws " + std::to_string(ws) +
                              " --expected " + q(manifest) + " 2>&1");
    EXPECT_EQ(loaded.exit_code, 0) << "ws " << ws << ":\n" << loaded.output;
  }
}

// torch.save -> DCP on 1 rank, loaded by PyTorch 2.6 (dcp_to_torch_save + torch.load).
TEST(ReshardTest, PyTorch26ReadsATorchSaveConversion) {
  SP_REQUIRE_TORCH26(oracle);
  TempDir tmp;
  std::string src = tmp.file("full.pt"), dst = tmp.file("dcp1");
  write_torch_file(src);
  auto r = run_command(kTool + " reshard -q " + q(src) + " " + q(dst) + " --ranks 1 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string script =
      "import sys, torch\n"
      "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n"
      "dcp_to_torch_save(sys.argv[1], sys.argv[2])\n"
      "a = torch.load(sys.argv[2], weights_only=False)\n"
      "b = torch.load(sys.argv[3], weights_only=False)\n"
      "def same(x, y):\n"
      "    if isinstance(x, torch.Tensor): return isinstance(y, torch.Tensor) and x.dtype == y.dtype and "
      "torch.equal(x, y)\n"
      "    if isinstance(x, dict): return isinstance(y, dict) and set(x) == set(y) and all(same(x[k], y[k]) for k in "
      "x)\n"
      "    if isinstance(x, (list, tuple)): return len(x) == len(y) and all(same(p, q) for p, q in zip(x, y))\n"
      "    return x == y\n"
      "sys.exit(0 if same(a, b) else 1)\n";
  shardpoint::testing::write_text(tmp.file("check.py"), script);
  auto checked = run_command(oracle + " " + q(tmp.file("check.py")) + " " + q(dst) + " " + q(tmp.file("back.pt")) +
                             " " + q(src) + " 2>&1");
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
}

// A 96 MiB float32 tensor [24576, 1024] saved on 2 ranks (Shard(0)) plus a small one.
void save_large(const std::string& dir) {
  constexpr std::int64_t kRows = 24576, kCols = 1024;
  auto st = storage::open_storage(dir);
  comm::ThreadGroup group(2, comm::CommOptions{std::chrono::seconds(60)});
  group.run([&](comm::Communicator& comm) {
    const std::int64_t mine = kRows / 2;
    std::vector<float> data(static_cast<std::size_t>(mine * kCols));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 1000) + comm.rank();
    engine::TensorShard big;
    big.dtype = DType::kFloat32;
    big.global_shape = {kRows, kCols};
    big.offsets = {mine * comm.rank(), 0};
    big.sizes = {mine, kCols};
    big.data = std::as_writable_bytes(std::span(data));
    engine::StateDict d;
    d.emplace_back("big", engine::StateNode(std::move(big)));
    engine::StateNode root(std::move(d));
    engine::save(root, *st, comm);
  });
}

// reshard never holds a rank's boxes whole: a checkpoint larger than the budget is copied
// with about the budget (+ the output driver's staging buffers) in memory.
TEST(ReshardTest, PeakRssStaysNearTheMemoryBudget) {
  TempDir tmp;
  const std::string src = tmp.file("large"), dst = tmp.file("large3");
  save_large(src);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(kTool.c_str(), kTool.c_str(), "reshard", "-q", src.c_str(), dst.c_str(), "--ranks", "3", "--memory-budget",
            "8MiB", "--parallel", "2", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(::wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::printf("reshard 96 MiB 2 -> 3 ranks with --memory-budget 8MiB: peak RSS %.1f MiB\n", ru.ru_maxrss / 1024.0);
  // Slabs (8 MiB) + two writers' 8 MiB staging buffers + the program:
  // well under the 96 MiB payload, which is never held whole.
  EXPECT_LT(ru.ru_maxrss, 80 * 1024);
  EXPECT_EQ(inspect(dst), inspect(src));
  EXPECT_EQ(run_command(kTool + " verify " + q(dst) + " >/dev/null").exit_code, 0);
}

}  // namespace
}  // namespace shardpoint
