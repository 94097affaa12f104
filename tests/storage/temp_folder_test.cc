// TempFolder: built under a hidden temporary name, published with one rename, removed when
// not published.
#include "storage/temp_folder.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardpoint/error.h"
#include "test_util.h"

namespace shardpoint::storage {
namespace {

namespace fs = std::filesystem;

TEST(TempFolderTest, PublishRenamesOntoTheFinalPath) {
  testing::TempDir dir;
  const std::string final_path = dir.file("out");
  {
    TempFolder tmp(final_path);
    EXPECT_EQ(fs::path(tmp.path()).parent_path(), dir.path());
    EXPECT_TRUE(fs::path(tmp.path()).filename().string().starts_with(".out.sp-tmp."));
    std::ofstream(tmp.path() + "/a") << "x";
    EXPECT_FALSE(fs::exists(final_path));
    tmp.publish(/*durable=*/true);
  }
  EXPECT_TRUE(fs::exists(final_path + "/a"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(TempFolderTest, UnpublishedIsRemoved) {
  testing::TempDir dir;
  {
    TempFolder tmp(dir.file("out"));
    std::ofstream(tmp.path() + "/a") << "x";
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(TempFolderTest, MissingParentIsStorageError) {
  testing::TempDir dir;
  EXPECT_THROW(TempFolder(dir.file("no/such/out")), StorageError);
}

}  // namespace
}  // namespace shardpoint::storage
