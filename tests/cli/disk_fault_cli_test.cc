// Full disks and lost permissions under `shardpoint consolidate` and `shardpoint reshard`
// (the built binary; docs/durability.md §8): one "shardpoint: " line on stderr naming the
// output path and the OS error, exit 1, no output at the output's name and none of the
// command's files left (except where the lost permission itself forbids removing them,
// checked as such).
//
// ENOSPC: the output goes to a tmpfs the test mounts with the room the command needs up to
// a chosen file, minus one page (sizes from a reference run on a roomy disk). EACCES: the
// command runs as nobody without capabilities (root ignores permission bits), into a folder
// read-only from the start or one that loses its write permission at a named point
// (SHARDPOINT_TEST_READ_ONLY_AT, core/kill_point.h).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "comm/thread_communicator.h"
#include "disk_faults.h"
#include "engine/chunking.h"
#include "shardpoint/checkpoint.h"
#include "storage/local_storage.h"
#include "test_util.h"

namespace shardpoint {
namespace {

namespace fs = std::filesystem;
using testing::files_under;
using testing::joined;
using testing::pages_of;
using testing::TempDir;

using testing::kDenied;
using testing::kNoSpace;

struct ToolRun {
  int code = -1;
  std::vector<std::string> errors;  // stderr lines
};

ToolRun shardpoint_cli(const std::string& args, bool as_nobody = false, const std::string& env = "") {
  TempDir logs;
  const testing::CommandResult r =
      testing::run_command(env + " " + (as_nobody ? testing::as_nobody() : std::string()) + SP_SHARDPOINT + " " + args +
                           " 2>" + testing::shell_quote(logs.file("stderr")));
  ToolRun run{r.exit_code, {}};
  std::istringstream err(testing::read_text(logs.file("stderr")));
  for (std::string line; std::getline(err, line);) run.errors.push_back(line);
  return run;
}

std::string q(const fs::path& p) { return testing::shell_quote(p.string()); }

// One line, exit 1, naming `path` and `os_error`.
void expect_one_error(const ToolRun& run, const fs::path& path, const std::string& os_error) {
  EXPECT_EQ(run.code, 1);
  ASSERT_EQ(run.errors.size(), 1u) << joined(run.errors);
  EXPECT_TRUE(run.errors[0].starts_with("shardpoint: ")) << run.errors[0];
  EXPECT_NE(run.errors[0].find(path.string()), std::string::npos) << run.errors[0];
  EXPECT_NE(run.errors[0].find(os_error), std::string::npos) << run.errors[0];
}

// A 2-rank DCP checkpoint of ~256 KiB ("model.w" float32 [256, 256] on dim 0, "model.b"
// replicated, a step counter), readable by everyone (the nobody runs read it).
class Source {
 public:
  Source() {
    fs::permissions(dir_.path(),
                    fs::perms::others_read | fs::perms::others_exec | fs::perms::group_read | fs::perms::group_exec,
                    fs::perm_options::add);
    const int world = 2;
    std::vector<std::vector<float>> bufs(world);
    std::vector<float> bias(256, 0.25f);
    std::vector<engine::StateNode> roots(world);
    for (int r = 0; r < world; ++r) {
      engine::Box box = engine::shard_box({256, 256}, {world}, {engine::Placement::shard(0)}, {r});
      bufs[r].resize(static_cast<std::size_t>(engine::volume(box.sizes)));
      for (std::size_t i = 0; i < bufs[r].size(); ++i)
        bufs[r][i] = static_cast<float>(i % 997) * 0.5f + static_cast<float>(r);
      engine::StateDict model;
      model.emplace_back(
          "w", engine::StateNode(engine::TensorShard{
                   DType::kFloat32, {256, 256}, box.offsets, box.sizes, std::as_writable_bytes(std::span(bufs[r]))}));
      model.emplace_back("b", engine::StateNode(engine::TensorShard{
                                  DType::kFloat32, {256}, {0}, {256}, std::as_writable_bytes(std::span(bias))}));
      roots[r] = engine::StateNode(engine::StateDict{});
      roots[r].set("model", engine::StateNode(std::move(model)));
      roots[r].set("step", engine::StateNode(pickle::Value::integer(5)));
    }
    auto st = storage::open_local_storage_at(path().string());
    comm::ThreadGroup group(world);
    group.run([&](comm::Communicator& comm) { engine::save(roots[comm.rank()], *st, comm); });
  }
  fs::path path() const { return dir_.path() / "ckpt"; }

 private:
  TempDir dir_;
};

const Source& source() {
  static const Source s;  // saved once for the binary
  return s;
}

// The room a command's output needs: every file of `folder` in tmpfs pages, optionally
// only those `keep` accepts.
std::uint64_t pages_in(const fs::path& folder, const std::function<bool(const std::string&)>& keep = {}) {
  std::uint64_t total = 0;
  for (const std::string& f : files_under(folder)) {
    if (!keep || keep(fs::path(f).filename().string())) total += pages_of(fs::file_size(folder / f));
  }
  return total;
}

// ---------------------------------------------------------------------------------------
// consolidate

class ConsolidateDiskFault : public ::testing::Test {
 protected:
  TempDir roomy_;
};

// A torch.save output one page larger than the disk: fails in the middle of the file.
TEST_F(ConsolidateDiskFault, TorchFileOnFullDisk) {
  const ToolRun ok =
      shardpoint_cli("consolidate -q --layout dcp " + q(source().path()) + " --output " + q(roomy_.path() / "out.pt"));
  ASSERT_EQ(ok.code, 0) << joined(ok.errors);
  SP_MOUNT_OR_SKIP(disk, pages_of(fs::file_size(roomy_.path() / "out.pt")) - testing::page_bytes());
  const ToolRun run =
      shardpoint_cli("consolidate -q --layout dcp " + q(source().path()) + " --output " + q(disk.path() / "out.pt"));
  expect_one_error(run, disk.path() / "out.pt", kNoSpace);
  EXPECT_EQ(joined(testing::entries_under(disk.path())), "(nothing)");
}

// Safetensors in 2 shards + index: every shard fits, the index does not; the temporary
// folder goes with what it holds.
TEST_F(ConsolidateDiskFault, SafetensorsShardsOnFullDisk) {
  const std::string args = "consolidate -q --layout dcp --to safetensors --max-shard-size 200KB " + q(source().path());
  const ToolRun ok = shardpoint_cli(args + " --output " + q(roomy_.path() / "st"));
  ASSERT_EQ(ok.code, 0) << joined(ok.errors);
  ASSERT_EQ(joined(files_under(roomy_.path() / "st")),
            "model-00001-of-00002.safetensors, model-00002-of-00002.safetensors, model.safetensors.index.json");
  SP_MOUNT_OR_SKIP(disk, pages_in(roomy_.path() / "st") - testing::page_bytes());
  const ToolRun run = shardpoint_cli(args + " --output " + q(disk.path() / "st"));
  expect_one_error(run, disk.path(), kNoSpace);
  if (!run.errors.empty()) {
    EXPECT_NE(run.errors[0].find("/model.safetensors.index.json\""), std::string::npos) << run.errors[0];
  }
  EXPECT_EQ(joined(testing::entries_under(disk.path())), "(nothing)");
}

class ConsolidateLostPermission : public ::testing::Test {
 protected:
  void SetUp() override {
    const testing::CommandResult probe = testing::run_command(testing::as_nobody() + "/bin/sh -c 'test ! -w /' 2>&1");
    if (probe.exit_code != 0) GTEST_SKIP() << "cannot run as nobody without capabilities (setpriv): " << probe.output;
    ASSERT_EQ(::chown(out_.path().c_str(), testing::kNobody, testing::kNobody), 0);
  }
  TempDir out_;  // owned by nobody
};

// The output folder is root's (0755): the temporary file cannot be created.
TEST_F(ConsolidateLostPermission, ReadOnlyOutputFolder) {
  fs::create_directory(out_.path() / "ro");
  const ToolRun run = shardpoint_cli(
      "consolidate -q --layout dcp " + q(source().path()) + " --output " + q(out_.path() / "ro/out.pt"), true);
  expect_one_error(run, out_.path() / "ro/out.pt", kDenied);
  EXPECT_EQ(joined(testing::entries_under(out_.path() / "ro")), "(nothing)");
}

// The output folder turns read-only once the file is complete under its temporary name:
// the rename is refused. Removing the temporary needs the lost permission too, so it stays
// (under its temporary name, never at the output's).
TEST_F(ConsolidateLostPermission, FolderTurnsReadOnlyBeforeTheRename) {
  const std::string env = "SHARDPOINT_TEST_READ_ONLY_AT=publish SHARDPOINT_TEST_READ_ONLY_PATH=" + q(out_.path());
  const ToolRun run = shardpoint_cli(
      "consolidate -q --layout dcp " + q(source().path()) + " --output " + q(out_.path() / "out.pt"), true, env);
  expect_one_error(run, out_.path() / "out.pt", kDenied);
  const std::vector<std::string> left = files_under(out_.path());
  ASSERT_EQ(left.size(), 1u) << joined(left);
  EXPECT_TRUE(left[0].starts_with("out.pt.sp-tmp.")) << left[0];
}

// ---------------------------------------------------------------------------------------
// reshard

// The files of a 2-rank reshard, in the order it writes them.
enum class FailAt { kData, kSidecar, kIndex, kMetadata };

struct ReshardSizes {
  std::uint64_t data = 0, sidecar = 0, index = 0, metadata = 0;
};

const ReshardSizes& reshard_sizes() {
  static const ReshardSizes sizes = [] {
    TempDir roomy;
    const ToolRun ok = shardpoint_cli("reshard -q --ranks 2 " + q(source().path()) + " " + q(roomy.path() / "dst"));
    EXPECT_EQ(ok.code, 0) << joined(ok.errors);
    const fs::path dst = roomy.path() / "dst";
    ReshardSizes s;
    s.data = pages_in(dst, [](const std::string& n) { return n.ends_with(".distcp"); });
    s.sidecar = pages_in(dst, [](const std::string& n) { return n == ".shardpoint-checksums.json"; });
    s.index = pages_in(dst, [](const std::string& n) { return n == ".shardpoint-index"; });
    s.metadata = pages_in(dst, [](const std::string& n) { return n == ".metadata"; });
    EXPECT_EQ(s.data + s.sidecar + s.index + s.metadata, pages_in(dst)) << joined(files_under(dst));
    return s;
  }();
  return sizes;
}

// The name the error gives for the file the reshard fails on.
const char* file_of(FailAt at) {
  switch (at) {
    case FailAt::kData: return "_0.distcp\"";
    case FailAt::kSidecar: return "/.shardpoint-checksums.json\"";
    case FailAt::kIndex: return "/.shardpoint-index\"";
    case FailAt::kMetadata: return "/.metadata\"";
  }
  return "?";
}

std::uint64_t room_failing_at(FailAt at) {
  const ReshardSizes& s = reshard_sizes();
  const std::uint64_t page = testing::page_bytes();
  switch (at) {
    case FailAt::kData: return s.data - page;
    case FailAt::kSidecar: return s.data + s.sidecar - page;
    case FailAt::kIndex: return s.data + s.sidecar + s.index - page;
    case FailAt::kMetadata: return s.data + s.sidecar + s.index + s.metadata - page;
  }
  return 0;
}

struct ReshardCase {
  FailAt at;
  bool dst_exists;  // an empty DST made beforehand stays (empty); a new one goes
};

std::string describe(const ReshardCase& c) {
  static const char* const kNames[] = {"data", "sidecar", "index", "metadata"};
  return std::string(kNames[static_cast<int>(c.at)]) + (c.dst_exists ? "_EmptyDst" : "_NewDst");
}
std::string case_name(const ::testing::TestParamInfo<ReshardCase>& info) { return describe(info.param); }
void PrintTo(const ReshardCase& c, std::ostream* os) { *os << describe(c); }

class ReshardDiskFull : public ::testing::TestWithParam<ReshardCase> {};

TEST_P(ReshardDiskFull, FailsCleanly) {
  const std::uint64_t room = room_failing_at(GetParam().at);
  ASSERT_FALSE(HasFailure());
  SP_MOUNT_OR_SKIP(disk, room);
  const fs::path dst = disk.path() / "dst";
  if (GetParam().dst_exists) fs::create_directory(dst);
  const ToolRun run = shardpoint_cli("reshard -q --ranks 2 " + q(source().path()) + " " + q(dst));
  expect_one_error(run, dst, kNoSpace);
  if (!run.errors.empty()) {
    EXPECT_NE(run.errors[0].find(file_of(GetParam().at)), std::string::npos) << run.errors[0];
  }
  EXPECT_EQ(joined(testing::entries_under(disk.path())), GetParam().dst_exists ? "dst" : "(nothing)");
}

INSTANTIATE_TEST_SUITE_P(Phases, ReshardDiskFull,
                         ::testing::Values(ReshardCase{FailAt::kData, false}, ReshardCase{FailAt::kSidecar, false},
                                           ReshardCase{FailAt::kIndex, false}, ReshardCase{FailAt::kMetadata, false},
                                           ReshardCase{FailAt::kMetadata, true}),
                         case_name);

class ReshardLostPermission : public ConsolidateLostPermission {};

// DST's parent is root's (0755): DST cannot be created.
TEST_F(ReshardLostPermission, ReadOnlyParent) {
  fs::create_directory(out_.path() / "ro");
  const ToolRun run =
      shardpoint_cli("reshard -q --ranks 2 " + q(source().path()) + " " + q(out_.path() / "ro/dst"), true);
  expect_one_error(run, out_.path() / "ro/dst", kDenied);
  EXPECT_EQ(joined(testing::entries_under(out_.path() / "ro")), "(nothing)");
}

// DST turns read-only after the data files, before the checksum sidecar: nothing is
// committed (no .metadata; verify refuses DST). The data files cannot be removed without
// the lost permission, so they stay.
TEST_F(ReshardLostPermission, DstTurnsReadOnlyBeforeTheSidecar) {
  const fs::path dst = out_.path() / "dst";
  fs::create_directory(dst);
  ASSERT_EQ(::chown(dst.c_str(), testing::kNobody, testing::kNobody), 0);
  const std::string env = "SHARDPOINT_TEST_READ_ONLY_AT=sidecar SHARDPOINT_TEST_READ_ONLY_PATH=" + q(dst);
  const ToolRun run = shardpoint_cli("reshard -q --ranks 2 " + q(source().path()) + " " + q(dst), true, env);
  expect_one_error(run, dst, kDenied);
  EXPECT_EQ(joined(files_under(dst)), "__0_0.distcp, __1_0.distcp");
  const ToolRun verify = shardpoint_cli("verify " + q(dst));
  EXPECT_NE(verify.code, 0);
}

}  // namespace
}  // namespace shardpoint
