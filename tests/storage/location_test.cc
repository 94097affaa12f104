// Location: local paths and storage URLs parsed, normalised, split and joined.
#include "shardpoint/location.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "shardpoint/error.h"

namespace shardpoint::storage {
namespace {

std::string norm(std::string_view text) { return Location::parse(text).to_string(); }

std::string parent(std::string_view text) {
  std::optional<Location> p = Location::parse(text).parent();
  return p ? p->to_string() : std::string("none");
}

TEST(LocationTest, LocalPathsArePathlibNormalised) {
  // The cases consolidate's normalize_path was tested with.
  EXPECT_EQ(norm("a//b/./c/"), "a/b/c");
  EXPECT_EQ(norm("/x/"), "/x");
  EXPECT_EQ(norm("./"), ".");
  EXPECT_EQ(norm("/"), "/");
  EXPECT_EQ(norm(""), ".");
  EXPECT_EQ(norm("//x//"), "/x");
  // ".." is kept: a symlink may stand before it.
  EXPECT_EQ(norm("a/../b"), "a/../b");
  EXPECT_EQ(norm("../x"), "../x");
  const Location local = Location::parse("/data/ckpt");
  EXPECT_FALSE(local.is_remote());
  EXPECT_EQ(local.scheme(), Scheme::kFile);
  EXPECT_EQ(local.scheme_name(), "file");
  EXPECT_EQ(local.authority(), "");
  EXPECT_EQ(local.path(), "/data/ckpt");
  EXPECT_EQ(local.query(), "");
  EXPECT_EQ(Location(), Location::parse("."));
}

TEST(LocationTest, FileUrlsAreLocalPaths) {
  EXPECT_EQ(Location::parse("file:///tmp/x/"), Location::parse("/tmp/x"));
  EXPECT_EQ(Location::parse("FILE:///tmp/x"), Location::parse("/tmp/x"));
  EXPECT_EQ(Location::parse("file://localhost/tmp/x"), Location::parse("/tmp/x"));
  EXPECT_FALSE(Location::parse("file:///tmp/x").is_remote());
  EXPECT_THROW(Location::parse("file://host/tmp/x"), UsageError);
  EXPECT_THROW(Location::parse("file:///tmp/x?a=b"), UsageError);
  EXPECT_THROW(Location::parse("file:///tmp/x#f"), UsageError);
}

TEST(LocationTest, UrlsSplitIntoSchemeBucketPathQuery) {
  const Location s3 = Location::parse("S3://bucket//ckpt/./step-1/?region=x/y");
  EXPECT_TRUE(s3.is_remote());
  EXPECT_EQ(s3.scheme(), Scheme::kS3);
  EXPECT_EQ(s3.scheme_name(), "s3");
  EXPECT_EQ(s3.authority(), "bucket");
  EXPECT_EQ(s3.path(), "ckpt/step-1");
  EXPECT_EQ(s3.query(), "?region=x/y");
  EXPECT_EQ(s3.to_string(), "s3://bucket/ckpt/step-1?region=x/y");

  EXPECT_EQ(norm("gs://b/p/"), "gs://b/p");
  EXPECT_EQ(norm("gs://b/"), "gs://b");
  EXPECT_EQ(norm("az://container/a/b"), "az://container/a/b");
  const Location abfs = Location::parse("abfss://c@acct.dfs.core.windows.net/p/q");
  EXPECT_EQ(abfs.scheme(), Scheme::kAbfss);
  EXPECT_EQ(abfs.scheme_name(), "abfss");
  EXPECT_EQ(abfs.authority(), "c@acct.dfs.core.windows.net");
  EXPECT_EQ(abfs.path(), "p/q");
  EXPECT_EQ(Location::parse("memory://name").path(), "");
  EXPECT_EQ(norm("s3://b/a/../c"), "s3://b/a/../c");
}

TEST(LocationTest, WhatIsRemote) {
  // The cases reshard's is_storage_url was tested with.
  EXPECT_TRUE(Location::parse("s3://b/p").is_remote());
  EXPECT_TRUE(Location::parse("memory://x").is_remote());
  EXPECT_FALSE(Location::parse("file:///tmp/x").is_remote());
  EXPECT_FALSE(Location::parse("/tmp/x").is_remote());
  EXPECT_FALSE(Location::parse("://x").is_remote());
  // Not a scheme (RFC 3986: a letter, then letters, digits, + - .): a local path.
  EXPECT_FALSE(Location::parse("a b://x").is_remote());
  EXPECT_FALSE(Location::parse("1x://x").is_remote());
  EXPECT_TRUE(Location::parse("test-scheme+v1.2://x").is_remote());
  EXPECT_EQ(Location::parse("test-scheme+v1.2://x").scheme(), Scheme::kOther);
  EXPECT_EQ(Location::parse("test-scheme+v1.2://x").scheme_name(), "test-scheme+v1.2");
  EXPECT_EQ(Location::parse("GS://b").scheme(), Scheme::kGcs);
  EXPECT_EQ(Location::parse("az://c").scheme(), Scheme::kAzure);
  EXPECT_EQ(Location::parse("abfs://c@a.dfs.core.windows.net").scheme(), Scheme::kAbfs);
  EXPECT_EQ(Location::parse("memory://n").scheme(), Scheme::kMemory);
}

TEST(LocationTest, QueryOptionsSplitKeyValuePairs) {
  using Pairs = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(Location::parse("s3://b/p?region=x&endpoint=http://h:1/").query_options(),
            (Pairs{{"region", "x"}, {"endpoint", "http://h:1/"}}));
  EXPECT_EQ(Location::parse("s3://b/p").query_options(), Pairs{});
  EXPECT_EQ(Location::parse("s3://b?k=").query_options(), (Pairs{{"k", ""}}));
  for (const char* bad : {"s3://b?region", "s3://b?=x", "s3://b?a=1&&b=2", "s3://b?a=1&"}) {
    try {
      Location::parse(bad).query_options();
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(LocationTest, TextIsWhatWasParsedAndNotPartOfTheValue) {
  const Location loc = Location::parse("s3://b//p/./q/");
  EXPECT_EQ(loc.text(), "s3://b//p/./q/");
  EXPECT_EQ(loc, Location::parse("s3://b/p/q"));
  EXPECT_TRUE(loc.dropped_segments());
  EXPECT_FALSE(Location::parse("s3://b/p/q/").dropped_segments());
  EXPECT_FALSE(Location::parse("s3://b/").dropped_segments());
  EXPECT_TRUE(Location::parse("s3://b//").dropped_segments() == false);
  EXPECT_TRUE(Location::parse("s3://b/./x").dropped_segments());
  EXPECT_EQ(loc.parent()->text(), "s3://b/p");
  EXPECT_FALSE(loc.child("k").dropped_segments());
  EXPECT_TRUE(loc.trailing_slash());
  EXPECT_TRUE(Location::parse("s3://b/?q=1").trailing_slash());
  EXPECT_FALSE(Location::parse("s3://b?q=/").trailing_slash());
  EXPECT_TRUE(Location::parse("ckpt/").trailing_slash());
  EXPECT_FALSE(loc.parent()->trailing_slash());
  EXPECT_FALSE(loc.canonical().trailing_slash());
  EXPECT_EQ(loc.canonical().text(), "s3://b/p/q");
}

TEST(LocationTest, ParentAndName) {
  // The object under a URL prefix: the query stays with the parent.
  EXPECT_EQ(parent("s3://b/p/x.pt"), "s3://b/p");
  EXPECT_EQ(Location::parse("s3://b/p/x.pt").name(), "x.pt");
  EXPECT_EQ(parent("s3://b/x.pt"), "s3://b");
  EXPECT_EQ(parent("az://acct/c/p/x.pt?sv=1&sig=a/b"), "az://acct/c/p?sv=1&sig=a/b");
  EXPECT_EQ(Location::parse("az://acct/c/p/x.pt?sv=1&sig=a/b").name(), "x.pt");
  EXPECT_EQ(parent("gs://b/a//x.pt"), "gs://b/a");
  EXPECT_EQ(parent("s3://b"), "none");
  EXPECT_EQ(parent("s3://b?q=1"), "none");
  EXPECT_EQ(parent("memory://name"), "none");
  EXPECT_EQ(Location::parse("s3://b").name(), "");
  // Local paths.
  EXPECT_EQ(parent("/data/ckpt"), "/data");
  EXPECT_EQ(parent("/x"), "/");
  EXPECT_EQ(parent("x"), ".");
  EXPECT_EQ(parent("a/b/"), "a");
  EXPECT_EQ(parent(".."), ".");
  EXPECT_EQ(parent("/"), "none");
  EXPECT_EQ(parent("."), "none");
  EXPECT_EQ(Location::parse("/data/ckpt.pt").name(), "ckpt.pt");
  EXPECT_EQ(Location::parse("/").name(), "");
}

TEST(LocationTest, ChildJoinsAndNormalises) {
  EXPECT_EQ(Location::parse(".").child("x").to_string(), "x");
  EXPECT_EQ(Location::parse("/").child("x").to_string(), "/x");
  EXPECT_EQ(Location::parse("/a").child("b//c/").to_string(), "/a/b/c");
  EXPECT_EQ(Location::parse("/a").child(".").to_string(), "/a");
  EXPECT_EQ(Location::parse("/a").child("").to_string(), "/a");
  EXPECT_EQ(Location::parse("s3://b").child("k").to_string(), "s3://b/k");
  EXPECT_EQ(Location::parse("s3://b/p?q=1").child("k/x").to_string(), "s3://b/p/k/x?q=1");
}

TEST(LocationTest, ParentChildRoundTrips) {
  for (const char* text : {"/data/ckpt", "ckpt", "a/b/c", "/x", "s3://b/x", "s3://b/p/q?r=1", "gs://b/a/b/c",
                           "az://c/p", "abfs://c@a.dfs.core.windows.net/p", "memory://n/k", "../up"}) {
    const Location loc = Location::parse(text);
    std::optional<Location> up = loc.parent();
    ASSERT_TRUE(up) << text;
    EXPECT_EQ(up->child(loc.name()), loc) << text;
    EXPECT_EQ(Location::parse(loc.to_string()), loc) << text;
  }
}

TEST(LocationTest, AbsoluteResolvesLocalPathsOnly) {
  const std::string cwd = std::filesystem::current_path().string();
  EXPECT_EQ(Location::parse("a/./b/../c/").absolute().to_string(), Location::parse(cwd).child("a/c").to_string());
  EXPECT_EQ(Location::parse("/x/y/..").absolute().to_string(), "/x");
  EXPECT_EQ(Location::parse("/").absolute().to_string(), "/");
  EXPECT_EQ(Location::parse("s3://b/a/../c").absolute().to_string(), "s3://b/a/../c");
}

}  // namespace
}  // namespace shardpoint::storage
