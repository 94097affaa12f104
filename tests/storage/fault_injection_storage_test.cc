#include "storage/fault_injection_storage.h"

#include <gtest/gtest.h>

#include "shardpoint/error.h"
#include "storage/memory_storage.h"

namespace shardpoint::storage {
namespace {

std::shared_ptr<Storage> fresh() { return open_memory_storage(Location::parse("memory://"), {}); }

TEST(FaultInjectionStorageTest, FailsTheNthCommitOnly) {
  auto base = fresh();
  FaultInjectionStorage faulty(base);
  faulty.fail_nth(FaultOp::kCommit, 2, StorageError::Kind::kNoSpace);
  for (int i = 0; i < 3; ++i) {
    auto w = faulty.open_writer("__" + std::to_string(i) + "_0.distcp");
    w->append(as_bytes(std::string_view("data")));
    if (i == 1) {
      try {
        w->commit();
        FAIL() << "second commit did not fail";
      } catch (const StorageError& e) {
        EXPECT_EQ(e.kind(), StorageError::Kind::kNoSpace);
        EXPECT_NE(std::string(e.what()).find("__1_0.distcp"), std::string::npos) << e.what();
      }
    } else {
      w->commit();
    }
  }
  // The failed writer published nothing: what an engine test checks before writing .metadata.
  EXPECT_EQ(base->list("").size(), 2u);
  EXPECT_FALSE(base->try_stat("__1_0.distcp"));
  EXPECT_EQ(faulty.calls(FaultOp::kCommit), 3u);
  EXPECT_EQ(faulty.injected(), 1u);
}

TEST(FaultInjectionStorageTest, FailsWritesReadsAndAtomicWritesByKey) {
  auto base = fresh();
  FaultInjectionStorage faulty(base);
  faulty.fail(FaultRule{FaultOp::kWrite, 3, StorageError::Kind::kTransient, "rank1"});
  faulty.fail(FaultRule{FaultOp::kRead, 1, StorageError::Kind::kOther, {}});
  faulty.fail(FaultRule{FaultOp::kWriteAtomic, 1, StorageError::Kind::kPermission, ".metadata"});

  auto w0 = faulty.open_writer("rank0/x");
  auto w1 = faulty.open_writer("rank1/x");
  for (int i = 0; i < 4; ++i) EXPECT_NO_THROW(w0->append(as_bytes(std::string_view("a"))));
  EXPECT_NO_THROW(w1->append(as_bytes(std::string_view("b"))));
  EXPECT_NO_THROW(w1->append(as_bytes(std::string_view("b"))));
  try {
    w1->append(as_bytes(std::string_view("b")));
    FAIL();
  } catch (const StorageError& e) {
    EXPECT_TRUE(e.retryable());
  }
  EXPECT_NO_THROW(w1->append(as_bytes(std::string_view("b"))));  // fires once
  w0->commit();

  std::string buf(1, '\0');
  EXPECT_THROW(faulty.read("rank0/x", 0, std::as_writable_bytes(std::span(buf))), StorageError);
  EXPECT_NO_THROW(faulty.read("rank0/x", 0, std::as_writable_bytes(std::span(buf))));
  EXPECT_EQ(buf, "a");

  EXPECT_NO_THROW(faulty.write_atomic("meta.pt", as_bytes(std::string_view("m"))));
  try {
    faulty.write_atomic(".metadata", as_bytes(std::string_view("m")));
    FAIL();
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kPermission);
  }
  EXPECT_FALSE(base->try_stat(".metadata"));
  EXPECT_EQ(faulty.injected(), 3u);
  faulty.fail_nth(FaultOp::kStat, 1);
  faulty.clear();
  EXPECT_EQ(faulty.stat("meta.pt"), 1u);
}

TEST(FaultInjectionStorageTest, WrapperForwardsEverythingElse) {
  auto base = fresh();
  FaultInjectionStorage faulty(base);
  EXPECT_EQ(faulty.url(), base->url());
  EXPECT_EQ(faulty.features().parallel_writes, base->features().parallel_writes);
  faulty.write_atomic("a/b", as_bytes(std::string_view("xyz")));
  EXPECT_EQ(faulty.list("a/"), (std::vector<ObjectInfo>{{"a/b", 3}}));
  EXPECT_EQ(faulty.open_source("a/b")->read_string(1, 2, "x"), "yz");
  EXPECT_EQ(faulty.remove_prefix(""), 1u);
  EXPECT_EQ(faulty.calls(FaultOp::kList), 1u);
  EXPECT_EQ(faulty.calls(FaultOp::kRemove), 1u);
}

}  // namespace
}  // namespace shardpoint::storage
