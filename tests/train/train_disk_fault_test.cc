// Full disks and lost permissions while shardpoint-train saves (docs/durability.md §8): the
// run fails with one "shardpoint-train: " line on stderr (one for the job, also with 2
// ranks) that names the path and the OS error, commits nothing, leaves none of its files
// behind, and a committed checkpoint it was replacing still loads and verifies
// (`shardpoint verify`).
//
// ENOSPC: the root is a tmpfs the test mounts with exactly the room the save needs up to a
// chosen file, minus one page, so the save fails while writing that file (data files,
// checksum sidecar, load index, .metadata, meta.pt). The sizes come from a reference run of
// the same command on a roomy disk. EACCES: the run is started as nobody without
// capabilities (root ignores permission bits), into a folder that is read-only from the
// start or loses its write permission at a named point of the save
// (SHARDPOINT_TEST_READ_ONLY_AT, core/kill_point.h).
//
// Every run: --state-dict-type sharded --model-size tiny --max-steps 2 --every-n-train-steps 1
// --save-top-k 0 --save-last, so save 1 writes last.ckpt (step 1) and save 2 replaces it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "disk_faults.h"
#include "launch_ranks.h"
#include "test_util.h"
#include "torchfile/torch_file.h"

namespace shardpoint::train {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::files_under;
using testing::joined;
using testing::pages_of;

using testing::kDenied;
using testing::kNoSpace;

struct TrainRun {
  comm::ProcessResult result;
  std::vector<std::string> errors;  // stderr lines
};

struct RunOptions {
  int devices = 1;
  bool async = false;
  bool as_nobody = false;
  comm::EnvVars env;
};

TrainRun train(const fs::path& root, const RunOptions& o) {
  testing::TempDir logs;
  std::string command = (o.as_nobody ? testing::as_nobody() : std::string()) + SP_TRAIN_BIN + " --devices " +
                        std::to_string(o.devices) +
                        " --state-dict-type sharded --model-size tiny --max-steps 2 --every-n-train-steps 1"
                        " --save-top-k 0 --save-last --root " +
                        testing::shell_quote(root.string());
  if (o.async) command += " --async-save";
  command += " 2>" + testing::shell_quote(logs.file("stderr"));
  TrainRun run;
  run.result = testing::run_process({"/bin/sh", "-c", command}, o.env, 120s);
  std::istringstream err(testing::read_text(logs.file("stderr")));
  for (std::string line; std::getline(err, line);) run.errors.push_back(line);
  return run;
}

fs::path checkpoints_of(const fs::path& root) { return root / "lightning_logs/version_0/checkpoints"; }

// Bytes (in tmpfs pages) of each file a save writes, in the order it writes them.
struct SaveSizes {
  std::uint64_t data = 0;  // every __r_0.distcp
  std::uint64_t sidecar = 0, index = 0, metadata = 0, meta_pt = 0;
  std::uint64_t total() const { return data + sidecar + index + metadata + meta_pt; }
};

SaveSizes sizes_of(const fs::path& folder) {
  SaveSizes s;
  for (const auto& e : fs::directory_iterator(folder)) {
    const std::string name = e.path().filename().string();
    const std::uint64_t pages = pages_of(fs::file_size(e.path()));
    if (name.ends_with(".distcp")) s.data += pages;
    else if (name == ".shardpoint-checksums.json") s.sidecar += pages;
    else if (name == ".shardpoint-index") s.index += pages;
    else if (name == ".metadata") s.metadata += pages;
    else if (name == "meta.pt") s.meta_pt += pages;
    else ADD_FAILURE() << "unexpected file in a checkpoint: " << e.path();
  }
  return s;
}

// The two saves of the run: the reference run is killed right after save 2's exchange
// (remove_old@1), which leaves save 1's folder at the staging name and save 2's at last.ckpt.
struct ReferenceSizes {
  SaveSizes first, second;
};

const ReferenceSizes& reference_sizes(int devices) {
  static std::map<int, ReferenceSizes> cache;
  if (auto it = cache.find(devices); it != cache.end()) return it->second;
  testing::TempDir root;
  RunOptions o;
  o.devices = devices;
  o.env = {{"SHARDPOINT_TEST_KILL_AT", "remove_old@1"}};
  const TrainRun run = train(root.path(), o);
  EXPECT_EQ(run.result.signal, SIGKILL) << run.result.describe();
  const fs::path dir = checkpoints_of(root.path());
  ReferenceSizes sizes{sizes_of(dir / ".last.ckpt.sp-replace-2"), sizes_of(dir / "last.ckpt")};
  return cache[devices] = sizes;
}

// The file a save fails on.
enum class FailAt { kData, kSidecar, kIndex, kMetadata, kMetaPt };

const char* name_of(FailAt at) {
  switch (at) {
    case FailAt::kData: return "data";
    case FailAt::kSidecar: return "sidecar";
    case FailAt::kIndex: return "index";
    case FailAt::kMetadata: return "metadata";
    case FailAt::kMetaPt: return "meta_pt";
  }
  return "?";
}

// The name the error gives for the file a save fails on.
const char* file_of(FailAt at) {
  switch (at) {
    case FailAt::kData: return "_0.distcp\"";
    case FailAt::kSidecar: return "/.shardpoint-checksums.json\"";
    case FailAt::kIndex: return "/.shardpoint-index\"";
    case FailAt::kMetadata: return "/.metadata\"";
    case FailAt::kMetaPt: return "/meta.pt\"";
  }
  return "?";
}

// Room for every file written before `at` and all but one page of `at` itself.
std::uint64_t room_failing_at(const SaveSizes& s, FailAt at) {
  const std::uint64_t page = testing::page_bytes();
  switch (at) {
    case FailAt::kData: return s.data - page;
    case FailAt::kSidecar: return s.data + s.sidecar - page;
    case FailAt::kIndex: return s.data + s.sidecar + s.index - page;
    case FailAt::kMetadata: return s.data + s.sidecar + s.index + s.metadata - page;
    case FailAt::kMetaPt: return s.total() - page;
  }
  return 0;
}

// One line for the job (with several ranks, rank 0 prints the failure they agreed on),
// naming a path under `under` and `os_error`.
void expect_error_line(const TrainRun& run, const fs::path& under, const std::string& os_error) {
  EXPECT_EQ(run.result.exit_code, 2) << run.result.describe();
  ASSERT_EQ(run.errors.size(), 1u) << joined(run.errors);
  const std::string& line = run.errors[0];
  EXPECT_TRUE(line.starts_with("shardpoint-train: ")) << line;
  EXPECT_NE(line.find("\"" + under.string() + "/"), std::string::npos) << line;
  EXPECT_NE(line.find(os_error), std::string::npos) << line;
}

// The replaced checkpoint is still last.ckpt, at step 1, and verifies; nothing else is in
// the checkpoints folder (no staging folder, no temporary file) but `leftovers`.
void expect_first_checkpoint_kept(const fs::path& root, std::vector<std::string> leftovers = {}) {
  const fs::path last = checkpoints_of(root) / "last.ckpt";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(checkpoints_of(root))) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  leftovers.push_back("last.ckpt");
  std::sort(leftovers.begin(), leftovers.end());
  EXPECT_EQ(joined(names), joined(leftovers));
  ASSERT_TRUE(fs::is_regular_file(last / ".metadata")) << joined(files_under(root));
  ASSERT_TRUE(fs::is_regular_file(last / "meta.pt"));
  EXPECT_EQ(torchfile::TorchFile::open((last / "meta.pt").string())->root()->get("global_step")->as_int(), 1);
  const testing::CommandResult verify =
      testing::run_command(std::string(SP_CLI_BIN) + " verify " + testing::shell_quote(last.string()) + " 2>&1");
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_TRUE(verify.output.starts_with("ok: ")) << verify.output;
}

// ---------------------------------------------------------------------------------------
// ENOSPC

struct NoSpaceCase {
  FailAt at;
  bool overwrite;  // false: save 1 (nothing committed yet) fails; true: save 2 replacing it
  int devices = 1;
  bool async = false;
};

std::string describe(const NoSpaceCase& c) {
  return std::string(c.overwrite ? "overwrite" : "first save") + ", fails at " + name_of(c.at) +
         (c.devices > 1 ? ", " + std::to_string(c.devices) + " ranks" : "") + (c.async ? ", async" : "");
}

// Runs the case on a disk with the room it needs to fail where it should. The cases of a
// test share one reference run (each test is a process of its own under ctest).
void run_case(const NoSpaceCase& c) {
  SCOPED_TRACE(describe(c));
  const ReferenceSizes& ref = reference_sizes(c.devices);
  ASSERT_FALSE(::testing::Test::HasFailure());
  // Overwrite: save 1 fits whole, save 2 fails at c.at. First save: save 1 fails at c.at.
  const std::uint64_t room =
      (c.overwrite ? ref.first.total() : 0) + room_failing_at(c.overwrite ? ref.second : ref.first, c.at);
  SP_MOUNT_OR_SKIP(disk, room);
  RunOptions o;
  o.devices = c.devices;
  o.async = c.async;
  const TrainRun run = train(disk.path(), o);
  expect_error_line(run, checkpoints_of(disk.path()), kNoSpace);
  if (!run.errors.empty()) {
    EXPECT_NE(run.errors[0].find(file_of(c.at)), std::string::npos) << run.errors[0];
  }
  if (c.overwrite) {
    expect_first_checkpoint_kept(disk.path());
  } else {
    EXPECT_EQ(joined(files_under(disk.path())), "(nothing)");
    EXPECT_EQ(joined(testing::entries_under(checkpoints_of(disk.path()))), "(nothing)");
  }
}

constexpr FailAt kEveryFile[] = {FailAt::kData, FailAt::kSidecar, FailAt::kIndex, FailAt::kMetadata, FailAt::kMetaPt};

// Save 1 fails: nothing is left on the disk.
TEST(TrainDiskFull, FirstSave) {
  for (FailAt at : kEveryFile) run_case({at, false});
}

// Save 2, replacing last.ckpt, fails: last.ckpt is still save 1's and verifies.
TEST(TrainDiskFull, Overwrite) {
  for (FailAt at : kEveryFile) run_case({at, true});
}

TEST(TrainDiskFull, OverwriteAsync) {
  for (FailAt at : {FailAt::kData, FailAt::kMetaPt}) run_case({at, true, 1, true});
}

TEST(TrainDiskFull, OverwriteTwoRanks) { run_case({FailAt::kSidecar, true, 2}); }

// ---------------------------------------------------------------------------------------
// EACCES (the run as nobody, without capabilities)

class TrainLostPermission : public ::testing::Test {
 protected:
  void SetUp() override {
    // Permission bits must apply: skip where setpriv is missing or cannot drop root's rights.
    const testing::CommandResult probe = testing::run_command(testing::as_nobody() + "/bin/sh -c 'test ! -w /' 2>&1");
    if (probe.exit_code != 0) GTEST_SKIP() << "cannot run as nobody without capabilities (setpriv): " << probe.output;
    ASSERT_EQ(::chown(root_.path().c_str(), testing::kNobody, testing::kNobody), 0);
  }
  testing::TempDir root_;
};

// lightning_logs is made by root and read-only for the run: save 1 cannot create the
// version folder it saves into.
TEST_F(TrainLostPermission, FirstSaveIntoReadOnlyFolder) {
  const fs::path logs = root_.path() / "lightning_logs";
  fs::create_directories(logs);  // owned by root, 0755
  RunOptions o;
  o.as_nobody = true;
  const TrainRun run = train(root_.path(), o);
  expect_error_line(run, logs, kDenied);
  EXPECT_EQ(joined(testing::entries_under(logs)), "(nothing)");
}

// Save 2 (the replacement of last.ckpt) meets a checkpoints folder that turned read-only
// at `point`; returns the run.
TrainRun lose_permission_at(const fs::path& root, const std::string& point) {
  RunOptions o;
  o.as_nobody = true;
  o.env = {{"SHARDPOINT_TEST_READ_ONLY_AT", point}, {"SHARDPOINT_TEST_READ_ONLY_PATH", checkpoints_of(root).string()}};
  return train(root, o);
}

// Read-only before save 2 writes anything: its staging folder cannot be created.
TEST_F(TrainLostPermission, OverwriteFailsAtPlan) {
  const TrainRun run = lose_permission_at(root_.path(), "plan@2");
  expect_error_line(run, checkpoints_of(root_.path()), kDenied);
  fs::permissions(checkpoints_of(root_.path()), fs::perms::owner_write, fs::perm_options::add);
  expect_first_checkpoint_kept(root_.path());
}

// Read-only after save 2 is fully written in its staging folder: the exchange with
// last.ckpt is refused. The staging folder's files are removed; the folder itself cannot be
// (that needs the lost permission), so it stays, hidden and empty, until the next run, which
// removes it once the permission is back.
TEST_F(TrainLostPermission, OverwriteFailsAtPublish) {
  const TrainRun run = lose_permission_at(root_.path(), "publish@2");
  expect_error_line(run, checkpoints_of(root_.path()), kDenied);
  const fs::path staging = checkpoints_of(root_.path()) / ".last.ckpt.sp-replace-2";
  EXPECT_TRUE(fs::is_directory(staging));
  EXPECT_EQ(joined(testing::entries_under(staging)), "(nothing)");
  fs::permissions(checkpoints_of(root_.path()), fs::perms::owner_write, fs::perm_options::add);
  expect_first_checkpoint_kept(root_.path(), {".last.ckpt.sp-replace-2"});

  RunOptions o;
  o.as_nobody = true;
  const TrainRun next = train(root_.path(), o);  // into version_1; cleans version_0 first
  EXPECT_EQ(next.result.exit_code, 0) << next.result.describe() << joined(next.errors);
  EXPECT_NE(next.result.output.find("removed 1 leftover(s) of unfinished saves"), std::string::npos)
      << next.result.output;
  expect_first_checkpoint_kept(root_.path());
}

}  // namespace
}  // namespace shardpoint::train
