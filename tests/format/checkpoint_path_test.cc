#include "format/checkpoint_path.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "shardpoint/error.h"
#include "test_util.h"

namespace shardpoint::format {
namespace {

using shardpoint::testing::TempDir;
using shardpoint::testing::write_text;

TEST(CheckpointPathTest, PlainNamesAreSafe) {
  EXPECT_TRUE(is_safe_relative_path("__0_0.distcp"));
  EXPECT_TRUE(is_safe_relative_path("sub/__1_3.distcp"));
  EXPECT_TRUE(is_safe_relative_path("..hidden"));  // a name, not a parent reference
  EXPECT_TRUE(is_safe_relative_path("a..b"));
}

TEST(CheckpointPathTest, UnsafeNamesAreRefused) {
  for (const char* p :
       {"", "/etc/passwd", "..", "../x", "a/../../x", "a/..", "./a", "a/./b", "a//b", "a/", "a\\..\\b", "C:\\x"}) {
    EXPECT_FALSE(is_safe_relative_path(p)) << p;
  }
  EXPECT_FALSE(is_safe_relative_path(std::string_view("a\0b", 3)));
}

std::string error_of(const std::string& dir, const std::string& rel) {
  try {
    resolve_item_path(dir, rel);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CheckpointPathTest, ResolveJoinsInsideTheFolder) {
  TempDir dir;
  write_text(dir.file("__0_0.distcp"), "x");
  EXPECT_EQ(resolve_item_path(dir.path().string(), "__0_0.distcp"), dir.file("__0_0.distcp"));
  EXPECT_EQ(resolve_item_path(dir.path().string() + "/", "__0_0.distcp"), dir.file("__0_0.distcp"));
  // A file that does not exist yet resolves too (opening it reports it missing).
  EXPECT_EQ(resolve_item_path(dir.path().string(), "missing/__9_9.distcp"), dir.file("missing/__9_9.distcp"));
}

TEST(CheckpointPathTest, ResolveRefusesEscapes) {
  TempDir dir;
  const std::string d = dir.path().string();
  EXPECT_EQ(error_of(d, "../x"), "relative_path '../x' in .metadata escapes the checkpoint folder '" + d + "'");
  EXPECT_EQ(error_of(d, "/etc/passwd"),
            "relative_path '/etc/passwd' in .metadata escapes the checkpoint folder '" + d + "'");
  EXPECT_EQ(error_of(d, "a/../../x"),
            "relative_path 'a/../../x' in .metadata escapes the checkpoint folder '" + d + "'");
  EXPECT_NE(error_of(d, "").find("relative_path '' in .metadata is not a plain relative path"), std::string::npos);
  EXPECT_NE(error_of(d, "a//b").find("is not a plain relative path"), std::string::npos);
}

TEST(CheckpointPathTest, ResolveRefusesSymlinksLeavingTheFolder) {
  TempDir outside;
  TempDir dir;
  write_text(outside.file("secret"), "s");
  std::filesystem::create_symlink(outside.file("secret"), dir.file("__0_0.distcp"));
  std::filesystem::create_directory_symlink(outside.path(), dir.file("sub"));
  std::filesystem::create_symlink("../../..", dir.file("up"));
  const std::string d = dir.path().string();
  EXPECT_EQ(error_of(d, "__0_0.distcp"),
            "relative_path '__0_0.distcp' in .metadata escapes the checkpoint folder '" + d + "'");
  EXPECT_EQ(error_of(d, "sub/secret"),
            "relative_path 'sub/secret' in .metadata escapes the checkpoint folder '" + d + "'");
  EXPECT_EQ(error_of(d, "sub/not_yet"),
            "relative_path 'sub/not_yet' in .metadata escapes the checkpoint folder '" + d + "'");
  EXPECT_EQ(error_of(d, "up/etc"), "relative_path 'up/etc' in .metadata escapes the checkpoint folder '" + d + "'");

  // A symlink that stays inside is fine, and so is a checkpoint folder reached through one.
  std::filesystem::create_directory(dir.file("real"));
  write_text(dir.file("real/__1_0.distcp"), "x");
  std::filesystem::create_directory_symlink(dir.file("real"), dir.file("alias"));
  EXPECT_EQ(resolve_item_path(d, "alias/__1_0.distcp"), dir.file("alias/__1_0.distcp"));
  TempDir links;
  std::filesystem::create_directory_symlink(dir.path(), links.file("ckpt"));
  EXPECT_EQ(resolve_item_path(links.file("ckpt"), "real/__1_0.distcp"), links.file("ckpt") + "/real/__1_0.distcp");
}

}  // namespace
}  // namespace shardpoint::format
