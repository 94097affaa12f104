// engine/checkpoint_files.h: the commit rule over a Storage, staging names, leftovers of a
// whole folder, and the order of committed checkpoints at one step. (The C API's calls over
// the same functions: tests/capi/c_api_test.cc.)
#include "engine/checkpoint_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::engine {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void touch(const fs::path& path) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "x";
}

TEST(CheckpointFiles, CommittedNeedsEveryMarker) {
  auto storage = storage::open_storage("memory://");
  EXPECT_FALSE(is_committed(*storage));
  storage->write_atomic(".metadata", {});
  EXPECT_FALSE(is_committed(*storage));
  storage->write_atomic("meta.pt", {});
  EXPECT_TRUE(is_committed(*storage));
}

TEST(CheckpointFiles, StagingNames) {
  EXPECT_EQ(staging_path(Location::parse("/data/run/last.ckpt"), "7").to_string(), "/data/run/.last.ckpt.sp-replace-7");
  EXPECT_TRUE(is_staging_name(".last.ckpt.sp-replace-7"));
  EXPECT_FALSE(is_staging_name("last.ckpt.sp-replace-7"));  // not hidden: a user's name
  EXPECT_FALSE(is_staging_name(".last.ckpt"));
  EXPECT_THROW(staging_path(Location::parse("gs://bucket/last.ckpt"), "7"), UsageError);
  EXPECT_THROW(staging_path(Location::parse("/"), "7"), UsageError);
}

TEST(CheckpointFiles, FolderLeftoversAreStagingAndTemporaryFiles) {
  const fs::path dir = fresh_dir("sp_checkpoint_files_leftovers");
  touch(dir / ".a.ckpt.sp-replace-1" / "__0_0.distcp");
  touch(dir / "b.ckpt.sp-tmp.12.0");
  touch(dir / "c.ckpt" / ".metadata");
  EXPECT_EQ(remove_stale_staging(Location::parse(dir.string())), 2u);
  EXPECT_TRUE(fs::exists(dir / "c.ckpt" / ".metadata"));
  EXPECT_EQ(remove_stale_staging(Location::parse((dir / "missing").string())), 0u);
  EXPECT_EQ(remove_stale_staging(Location::parse("s3://bucket/checkpoints")), 0u);
  fs::remove_all(dir);
}

TEST(CheckpointFiles, SameStepOrdersByMetaPtTime) {
  const fs::path dir = fresh_dir("sp_checkpoint_files_order");
  for (const char* name : {"a-step=5.ckpt", "b-step=5.ckpt"}) {
    touch(dir / name / ".metadata");
    touch(dir / name / "meta.pt");
  }
  const auto now = fs::last_write_time(dir / "a-step=5.ckpt" / "meta.pt");
  fs::last_write_time(dir / "a-step=5.ckpt" / "meta.pt", now + std::chrono::seconds(10));
  const Location folder = Location::parse(dir.string());
  EXPECT_EQ(list_committed_checkpoints(folder),
            (std::vector<Location>{folder.child("b-step=5.ckpt"), folder.child("a-step=5.ckpt")}));
  remove_checkpoint(folder.child("a-step=5.ckpt"));
  EXPECT_EQ(list_committed_checkpoints(folder), std::vector<Location>{folder.child("b-step=5.ckpt")});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardpoint::engine
