// `shardpoint consolidate` and `shardpoint verify` end to end (the built binary):
//   interop: a Lightning-shaped checkpoint saved by PyTorch 2.6 DCP on 3 gloo ranks
//     (lightning_oracle.py) consolidated and compared exactly with what PyTorch's loading +
//     Lightning's renaming gives, loaded weights-only by 2.6 and (weights_only=False: 1.13's
//     weights-only unpickler has no BINFLOAT and the file holds Python floats) by 1.13;
//     safetensors output read by the `safetensors` package; --layout dcp/fabric;
//   exit codes and single error lines for usage errors, Lightning's validation, bad inputs
//     (truncated shard, garbage .metadata, missing shard, escaping relative_path, missing
//     output directory, full disk on a small tmpfs);
//   peak RSS of the process under --memory-budget on a checkpoint 4x larger;
//   SIGTERM mid-copy: exit 143, nothing left;
//   verify: clean folder/file exit 0, damaged ones exit 1 with the problems; --quick, --json,
//     and a file whose records carry no CRC-32 (passes, never "verified").
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/thread_communicator.h"
#include "core/byte_stream.h"
#include "engine/checkpoint_index.h"
#include "engine/checkpoint_test_state.h"
#include "engine/chunking.h"
#include "engine/torch_save.h"
#include "format/metadata_codec.h"
#include "shardpoint/checkpoint.h"
#include "storage/local_storage.h"
#include "test_util.h"
#include "tool_run.h"
#include "torchfile/torch_file.h"
#include "torchfile/zip_reader.h"

namespace shardpoint {
namespace {

namespace fs = std::filesystem;
using shardpoint::testing::run_command;
using shardpoint::testing::TempDir;

const std::string kTool = SP_SHARDPOINT;
const std::string kOracle = std::string(SP_SOURCE_DIR) + "/tests/cli/lightning_oracle.py";

std::string q(const std::string& s) { return "'" + s + "'"; }

using shardpoint::testing::ToolRun;

ToolRun tool(const std::string& args, const TempDir& scratch) { return shardpoint::testing::run_tool(args, scratch); }

std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

void write_meta_pt(const std::string& folder) {
  using pickle::Value;
  engine::StateNode root{engine::StateDict{}};
  root.set("epoch", engine::StateNode(Value::integer(1)));
  root.set("global_step", engine::StateNode(Value::integer(3)));
  root.set("pytorch-lightning_version", engine::StateNode(Value::str("2.6.0")));
  root.set("lr_schedulers", engine::StateNode(Value::list()));
  StringSink sink;
  engine::write_torch_save(root, sink, engine::TorchSaveFileOptions{"meta"});
  std::ofstream(folder + "/meta.pt", std::ios::binary) << sink.str();
}

// The engine test state on 2 ranks with "optim" renamed "optimizer_0", plus meta.pt.
void save_small(const std::string& folder) {
  std::vector<engine::testing::RankState> states;
  for (int r = 0; r < 2; ++r) {
    states.push_back(engine::testing::make_rank_state(r, 2, true));
    for (auto& [k, v] : states.back().root.dict()) {
      if (k == "optim") k = "optimizer_0";
    }
  }
  auto st = storage::open_local_storage_at(folder);
  comm::ThreadGroup group(2);
  group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });
  write_meta_pt(folder);
}

// ~`mib` MiB of float32 in a [rows, 1024] tensor sharded along dim 1 over 4 ranks, saved in
// a child process so this process stays small.
void save_large(const std::string& folder, int mib) {
  pid_t pid = ::fork();
  if (pid == 0) {
    try {
      const std::int64_t rows = std::int64_t{mib} * 256;
      const int world = 4;
      std::vector<std::vector<float>> bufs(world);
      std::vector<engine::StateNode> roots(world);
      for (int r = 0; r < world; ++r) {
        engine::Box box = engine::shard_box({rows, 1024}, {world}, {engine::Placement::shard(1)}, {r});
        bufs[r].assign(static_cast<std::size_t>(engine::volume(box.sizes)), static_cast<float>(r) + 0.5f);
        engine::TensorShard t{
            DType::kFloat32, {rows, 1024}, box.offsets, box.sizes, std::as_writable_bytes(std::span<float>(bufs[r]))};
        engine::StateDict model;
        model.emplace_back("big", engine::StateNode(t));
        roots[r] = engine::StateNode(engine::StateDict{});
        roots[r].set("model", engine::StateNode(std::move(model)));
      }
      auto st = storage::open_local_storage_at(folder);
      comm::ThreadGroup group(world);
      group.run([&](comm::Communicator& comm) { engine::save(roots[comm.rank()], *st, comm); });
      write_meta_pt(folder);
    } catch (...) {
      _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "saving the large checkpoint failed";
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ConsolidateCliTest, SuccessIsSilentAndDefaultOutputIsNextToFolder) {
  TempDir dir;
  save_small(dir.file("epoch=0-step=3.ckpt"));
  ToolRun r = tool("consolidate " + q(dir.file("epoch=0-step=3.ckpt") + "/"), dir);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");  // no progress bar when stderr is not a terminal
  EXPECT_TRUE(fs::is_regular_file(dir.file("epoch=0-step=3.ckpt.consolidated")));
  ToolRun v = tool("verify " + q(dir.file("epoch=0-step=3.ckpt.consolidated")), dir);
  EXPECT_EQ(v.code, 0) << v.out;
  auto listing = run_command(kTool + " inspect " + q(dir.file("epoch=0-step=3.ckpt.consolidated")));
  EXPECT_EQ(listing.exit_code, 0);
  EXPECT_NE(listing.output.find("state_dict.w"), std::string::npos) << listing.output;
  EXPECT_NE(listing.output.find("optimizer_states.0.state.0.exp_avg"), std::string::npos) << listing.output;
}

TEST(ConsolidateCliTest, UsageErrorsExit2) {
  TempDir dir;
  EXPECT_EQ(tool("consolidate", dir).code, 2);
  EXPECT_EQ(tool("consolidate x --layout nope", dir).code, 2);
  EXPECT_EQ(tool("consolidate x --memory-budget lots", dir).code, 2);
  EXPECT_EQ(tool("consolidate x --max-shard-size 1GB", dir).code, 2);   // torch output
  EXPECT_EQ(tool("consolidate x --max-shard-bytes 1GB", dir).code, 2);  // the option's name, the same rule
  EXPECT_EQ(tool("consolidate x --format nope", dir).code, 2);
  EXPECT_EQ(tool("consolidate x --memory-budget-bytes 1KiB", dir).code, 2);
  EXPECT_EQ(tool("verify", dir).code, 2);
}

TEST(ConsolidateCliTest, LightningValidationMessages) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  ToolRun r = tool("consolidate " + q(folder), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "shardpoint: The provided checkpoint folder does not exist: " + folder + "\n");
  testing::write_text(dir.file("f"), "x");
  r = tool("consolidate " + q(dir.file("f")), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "shardpoint: The provided checkpoint path must be a folder, containing the checkpoint shards: " +
                       dir.file("f") + "\n");
  fs::create_directory(folder);
  r = tool("consolidate " + q(folder), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "shardpoint: Only FSDP-sharded checkpoints saved with Lightning are supported for consolidation. The "
            "provided folder is not in that format: " +
                folder + "\n");
  fs::remove(folder);
  save_small(folder);
  r = tool("consolidate " + q(folder) + " --output_file " + q(dir.file("f")), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "shardpoint: The path for the converted checkpoint already exists. Choose a different path by providing "
            "`--output_file` or move/delete the file first: " +
                dir.file("f") + "\n");
  r = tool("consolidate " + q(folder) + " --output " + q(dir.file("missing/out.pt")), dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"ckpt", "f"}));
}

class BadInputCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = dir_.file("ckpt");
    save_small(folder_);
  }
  // One error line, exit 1, nothing written next to the folder; returns the line.
  std::string fails() {
    ToolRun r = tool("consolidate " + q(folder_), dir_);
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("shardpoint: ", 0), 0u) << r.err;
    EXPECT_EQ(names_in(dir_.path()), std::vector<std::string>{"ckpt"});
    ToolRun v = tool("verify " + q(folder_), dir_);
    EXPECT_EQ(v.code, 1) << v.out;
    EXPECT_FALSE(v.out.empty());
    return r.err;
  }
  TempDir dir_;
  std::string folder_;
};

TEST_F(BadInputCliTest, TruncatedShard) {
  fs::resize_file(folder_ + "/__1_0.distcp", fs::file_size(folder_ + "/__1_0.distcp") / 2);
  EXPECT_NE(fails().find("truncated"), std::string::npos);
}

TEST_F(BadInputCliTest, GarbageMetadata) {
  testing::write_text(folder_ + "/.metadata", std::string(100, '\x07'));
  EXPECT_NE(fails().find(".metadata"), std::string::npos);
}

TEST_F(BadInputCliTest, MissingShard) {
  fs::remove(folder_ + "/__1_0.distcp");
  EXPECT_NE(fails().find("__1_0.distcp"), std::string::npos);
}

TEST_F(BadInputCliTest, RelativePathEscapesFolder) {
  auto st = storage::open_local_storage_at(folder_);
  format::Metadata md = engine::read_metadata(*st);
  for (auto& [index, info] : md.storage_data) info.relative_path = "../" + info.relative_path;
  std::string bytes = format::encode_metadata(md);
  st->write_atomic(".metadata", as_bytes(bytes));
  EXPECT_NE(fails().find("escapes the checkpoint folder"), std::string::npos);
}

// verify checks the load index: it must match .metadata and agree with the blobs.
TEST(ConsolidateCliTest, VerifyChecksTheLoadIndex) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_small(folder);
  ASSERT_TRUE(fs::exists(folder + "/.shardpoint-index"));
  EXPECT_EQ(tool("verify " + q(folder), dir).code, 0);

  auto st = storage::open_local_storage_at(folder);
  auto read = [&](const char* key) { return st->try_read_all(key).value(); };
  const std::string metadata = read(".metadata");
  const std::string good = read(".shardpoint-index");
  engine::CheckpointIndex index = engine::decode_checkpoint_index(good, "index");
  ASSERT_FALSE(index.data_offsets.empty());
  index.data_offsets.begin()->second += 64;
  st->write_atomic(".shardpoint-index",
                   as_bytes(engine::encode_checkpoint_index(index.metadata, as_bytes(metadata), &*index.checksums,
                                                            index.data_offsets)));
  ToolRun v = tool("verify " + q(folder), dir);
  EXPECT_EQ(v.code, 1);
  EXPECT_NE(v.out.find(".shardpoint-index\": item \"" + index.data_offsets.begin()->first.fqn + "\": data starts at"),
            std::string::npos)
      << v.out;

  // A `.metadata` rewritten by another tool leaves the index stale.
  st->write_atomic(".shardpoint-index", as_bytes(good));
  format::Metadata md = format::decode_metadata(as_bytes(metadata), "md");
  for (auto& [fqn, entry] : md.state_dict_metadata) {
    if (auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) t->properties.requires_grad = true;
  }
  st->write_atomic(".metadata", as_bytes(format::encode_metadata(md)));
  v = tool("verify " + q(folder), dir);
  EXPECT_EQ(v.code, 1);
  EXPECT_NE(v.out.find(".shardpoint-index\": does not match .metadata"), std::string::npos) << v.out;
}

TEST(ConsolidateCliTest, VerifyReportsCrcMismatchInTorchFile) {
  TempDir dir;
  save_small(dir.file("ckpt"));
  ASSERT_EQ(tool("consolidate " + q(dir.file("ckpt")) + " --output_file " + q(dir.file("out.pt")), dir).code, 0);
  std::uint64_t at = 0;
  {
    auto file = torchfile::TorchFile::open(dir.file("out.pt"));
    at = file->tensors().front().storage.offset;
  }
  {
    std::fstream f(dir.file("out.pt"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = static_cast<char>(f.get() ^ 0x41);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(c);
  }
  ToolRun v = tool("verify " + q(dir.file("out.pt")), dir);
  EXPECT_EQ(v.code, 1);
  EXPECT_NE(v.out.find("CRC-32"), std::string::npos) << v.out << v.err;
}

// --quick checks the structure only and says so; --json reports which checks covered which
// bytes; a torch.save file whose writer stored no CRC-32s (0, as PyTorch with
// set_crc32_options(False)) passes, and its bytes are never called verified.
TEST(ConsolidateCliTest, VerifyQuickJsonAndRecordsWithoutChecksum) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_small(folder);
  ToolRun quick = tool("verify --quick " + q(folder), dir);
  EXPECT_EQ(quick.code, 0) << quick.out;
  EXPECT_NE(quick.out.find("structure only"), std::string::npos) << quick.out;
  EXPECT_EQ(quick.out.find("verified"), std::string::npos) << quick.out;
  ToolRun json = tool("verify --json " + q(folder), dir);
  EXPECT_EQ(json.code, 0) << json.out;
  for (const char* field :
       {"\"ok\": true", "\"zip_crc32\": {", "\"algorithm\": \"crc32c\"", "\"checks\": [", "\"format\": \"torch\""}) {
    EXPECT_NE(json.out.find(field), std::string::npos) << field << "\n" << json.out;
  }

  ASSERT_EQ(tool("consolidate " + q(folder) + " --output_file " + q(dir.file("out.pt")), dir).code, 0);
  std::string bytes = testing::read_text(dir.file("out.pt"));
  {
    MemorySource source(as_bytes(bytes), "out.pt");
    torchfile::ZipArchive archive(source);
    const std::uint64_t cd = archive.entries().back().data_offset + archive.entries().back().uncompressed_size;
    for (const auto& e : archive.entries()) {
      bytes.replace(static_cast<std::size_t>(e.data_offset + e.uncompressed_size + 4), 4, std::string(4, '\0'));
      const std::size_t central = bytes.find(std::string("PK\x01\x02", 4), static_cast<std::size_t>(cd));
      for (std::size_t at = central; at != std::string::npos; at = bytes.find(std::string("PK\x01\x02", 4), at + 1)) {
        if (bytes.compare(at + 46, e.name.size(), e.name) == 0) bytes.replace(at + 16, 4, std::string(4, '\0'));
      }
    }
  }
  testing::write_text(dir.file("nocrc.pt"), bytes);
  ToolRun v = tool("verify " + q(dir.file("nocrc.pt")), dir);
  EXPECT_EQ(v.code, 0) << v.out << v.err;
  EXPECT_NE(v.out.find(" 0 verified by a checksum"), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("with no checksum"), std::string::npos) << v.out;
  EXPECT_EQ(v.out.find("bytes verified"), std::string::npos) << v.out;
}

TEST(ConsolidateCliTest, FullDiskLeavesNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  TempDir dir;
  save_large(dir.file("ckpt"), 8);
  fs::create_directory(dir.file("small"));
  if (::mount("tmpfs", dir.file("small").c_str(), "tmpfs", 0, "size=2m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  ToolRun r = tool("consolidate " + q(dir.file("ckpt")) + " --output_file " + q(dir.file("small/out.pt")), dir);
  std::vector<std::string> left = names_in(dir.file("small"));
  ::umount(dir.file("small").c_str());
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(lines(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find("out.pt"), std::string::npos) << r.err;
  EXPECT_TRUE(left.empty()) << left.front();
}

// Starts `shardpoint consolidate CKPT --output_file OUT --memory-budget BUDGET` in a child
// process (stderr to /dev/null); returns its pid.
pid_t spawn_consolidate(const std::string& ckpt, const std::string& out, const char* budget) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 2);
    ::execl(kTool.c_str(), kTool.c_str(), "consolidate", ckpt.c_str(), "--output_file", out.c_str(), "--memory-budget",
            budget, static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Peak RSS of the whole process (VmHWM via wait4's ru_maxrss), budget 16 MiB, 64 MiB
// checkpoint: under the budget.
TEST(ConsolidateCliTest, PeakRssUnderBudget) {
  TempDir dir;
  save_large(dir.file("ckpt"), 64);
  const std::string out = dir.file("out.pt");
  pid_t pid = spawn_consolidate(dir.file("ckpt"), out, "16MiB");
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(::wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_GT(fs::file_size(out), std::uintmax_t{64} << 20);
  const long peak_kib = ru.ru_maxrss;
  std::printf("consolidate 64 MiB with --memory-budget 16MiB: peak RSS %.1f MiB\n", peak_kib / 1024.0);
  EXPECT_LT(peak_kib, 16 * 1024);
  EXPECT_EQ(tool("verify " + q(out), dir).code, 0);
}

TEST(ConsolidateCliTest, SigtermMidCopyLeavesNothing) {
  TempDir dir;
  save_large(dir.file("ckpt"), 64);
  const std::string out = dir.file("out.pt");
  pid_t pid = spawn_consolidate(dir.file("ckpt"), out, "1MiB");
  // Wait for the temporary output to appear, then stop the copy.
  bool seen = false;
  for (int i = 0; i < 2000 && !seen; ++i) {
    for (const auto& name : names_in(dir.path())) seen |= name.find(".sp-tmp.") != std::string::npos;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 0) GTEST_SKIP() << "the copy finished before SIGTERM arrived";
  EXPECT_EQ(WEXITSTATUS(status), 143);
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"ckpt"});
}

TEST(ConsolidateOracleTest, PyTorch26LightningCheckpoint) {
  SP_REQUIRE_TORCH26(py26);
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  auto saved = run_command(py26 + " " + q(kOracle) + " save " + q(folder) + " 2>&1");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;

  ToolRun r = tool("consolidate " + q(folder), dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out + r.err, "");
  const std::string out = folder + ".consolidated";
  auto check = run_command(py26 + " " + q(kOracle) + " check " + q(folder) + " " + q(out) + " --summary " +
                           q(dir.file("summary.json")) + " 2>&1");
  EXPECT_EQ(check.exit_code, 0) << check.output;

  if (run_command("/usr/bin/python3 -c 'import torch' 2>/dev/null").exit_code == 0) {
    auto old = run_command("/usr/bin/python3 " + q(kOracle) + " load113 " + q(out) + " " + q(dir.file("summary.json")) +
                           " 2>&1");
    EXPECT_EQ(old.exit_code, 0) << old.output;
  }

  for (const char* layout : {"fabric", "dcp"}) {
    const std::string o = dir.file(std::string(layout) + ".pt");
    ASSERT_EQ(tool("consolidate " + q(folder) + " --layout " + layout + " --output_file " + q(o), dir).code, 0);
    auto c =
        run_command(py26 + " " + q(kOracle) + " check " + q(folder) + " " + q(o) + " --layout " + layout + " 2>&1");
    EXPECT_EQ(c.exit_code, 0) << layout << ": " << c.output;
  }

  ASSERT_EQ(
      tool("consolidate " + q(folder) + " --to safetensors --output_file " + q(dir.file("m.safetensors")), dir).code,
      0);
  auto st =
      run_command(py26 + " " + q(kOracle) + " safetensors " + q(folder) + " " + q(dir.file("m.safetensors")) + " 2>&1");
  EXPECT_EQ(st.exit_code, 0) << st.output;
  ASSERT_EQ(tool("consolidate " + q(folder) + " --format safetensors --max-shard-bytes 200B --output_file " +
                     q(dir.file("hf")),
                 dir)
                .code,
            0);
  EXPECT_GT(names_in(dir.file("hf")).size(), 2u);
  auto sh = run_command(py26 + " " + q(kOracle) + " safetensors " + q(folder) + " " + q(dir.file("hf")) + " 2>&1");
  EXPECT_EQ(sh.exit_code, 0) << sh.output;

  ToolRun v = tool("verify " + q(folder), dir);
  EXPECT_EQ(v.code, 0) << v.out;
}

}  // namespace
}  // namespace shardpoint
