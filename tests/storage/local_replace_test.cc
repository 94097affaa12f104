#include "storage/local_replace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "shardpoint/error.h"
#include "test_util.h"

namespace shardpoint::storage {
namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ReplaceLocalFolderTest, MovesIntoAnAbsentTarget) {
  shardpoint::testing::TempDir dir;
  const fs::path staged = dir.path() / ".ckpt.staged";
  const fs::path target = dir.path() / "ckpt";
  write_file(staged / ".metadata", "new");
  replace_local_folder(staged.string(), target.string(), /*durable=*/true);
  EXPECT_EQ(read_file(target / ".metadata"), "new");
  EXPECT_FALSE(fs::exists(staged));
}

TEST(ReplaceLocalFolderTest, ExchangesWithAnExistingTargetAndRemovesTheOld) {
  shardpoint::testing::TempDir dir;
  const fs::path staged = dir.path() / ".ckpt.staged";
  const fs::path target = dir.path() / "ckpt";
  write_file(target / ".metadata", "old");
  write_file(target / "__0_0.distcp", "old data");
  write_file(staged / ".metadata", "new");
  replace_local_folder(staged.string(), target.string(), /*durable=*/false);
  EXPECT_EQ(read_file(target / ".metadata"), "new");
  EXPECT_FALSE(fs::exists(target / "__0_0.distcp"));  // nothing of the old folder is mixed in
  EXPECT_FALSE(fs::exists(staged));
}

TEST(ReplaceLocalFolderTest, MissingStagedFolderIsANotFoundErrorAndChangesNothing) {
  shardpoint::testing::TempDir dir;
  const fs::path target = dir.path() / "ckpt";
  write_file(target / ".metadata", "old");
  try {
    replace_local_folder((dir.path() / "absent").string(), target.string(), true);
    FAIL() << "no error";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("absent"), std::string::npos);
  }
  EXPECT_EQ(read_file(target / ".metadata"), "old");
}

}  // namespace
}  // namespace shardpoint::storage
