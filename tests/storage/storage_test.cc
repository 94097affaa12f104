// Key validation and IoOptions checks shared by all drivers.
#include "shardpoint/storage.h"

#include <gtest/gtest.h>

#include <vector>

#include "shardpoint/error.h"

namespace shardpoint::storage {
namespace {

TEST(ValidateKeyTest, AcceptsRelativePaths) {
  for (std::string key : {"__0_0.distcp", ".metadata", "a/b/c", "step=3/__1_0.distcp", "..x", "x..", "a/.hidden",
                          "with space", "dots.in.name"}) {
    EXPECT_NO_THROW(validate_key(key)) << key;
  }
}

TEST(ValidateKeyTest, RejectsEscapesAndOddSegments) {
  for (std::string key : std::vector<std::string>{"", ".", "..", "a/..", "../a", "a/../b", "/abs", "/", "a/./b", "./a",
                                                  "a//b", "a/", "a.sp-tmp.1.2", std::string("a\0b", 3)}) {
    EXPECT_THROW(validate_key(key), UsageError) << key;
  }
  try {
    validate_key("a/../b");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "invalid storage key \"a/../b\": segment \"..\" is not allowed (keys are relative paths inside the "
              "storage root, like \"dir/__0_0.distcp\")");
  }
}

TEST(ValidatePrefixTest, AllowsPartialLastSegment) {
  for (std::string prefix : {"", "a/", "a/b", "__0_", ".", "..", "a/.", "a/.."}) {
    EXPECT_NO_THROW(validate_prefix(prefix)) << prefix;
  }
  for (std::string prefix : {"/", "/a", "../", "a/../", "a//", "./"}) {
    EXPECT_THROW(validate_prefix(prefix), UsageError) << prefix;
  }
}

TEST(CheckIoTest, DeadlineAndStop) {
  EXPECT_NO_THROW(check_io({}, "op"));
  try {
    check_io(IoOptions::with_timeout(std::chrono::milliseconds(-1)), "read x");
    FAIL();
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kTransient);
    EXPECT_EQ(std::string(e.what()), "read x: deadline exceeded");
  }
  std::stop_source stop;
  IoOptions io;
  io.stop = stop.get_token();
  EXPECT_NO_THROW(check_io(io, "op"));
  stop.request_stop();
  EXPECT_THROW(check_io(io, "op"), StorageError);
}

}  // namespace
}  // namespace shardpoint::storage
