// The "memory" driver: the conformance suite, plus named-namespace sharing.
#include "storage/memory_storage.h"

#include <gtest/gtest.h>

#include <atomic>

#include "shardpoint/error.h"
#include "storage_conformance.h"

namespace shardpoint::storage::testing {
namespace {

StorageUnderTest make_memory() {
  // A fresh private namespace per test.
  return {open_memory_storage(Location::parse("memory://"), {}), nullptr};
}

INSTANTIATE_TEST_SUITE_P(Memory, StorageConformanceTest, ::testing::Values(StorageFactory{"memory", &make_memory}),
                         StorageFactoryName());

}  // namespace
}  // namespace shardpoint::storage::testing

namespace shardpoint::storage {
namespace {

TEST(MemoryStorageTest, SameNameSharesObjects) {
  auto a = open_memory_storage(Location::parse("memory://shared-test"), {});
  auto b = open_memory_storage(Location::parse("memory://shared-test"), {});
  auto other = open_memory_storage(Location::parse("memory://other-test"), {});
  a->write_atomic("x/.metadata", as_bytes(std::string_view("meta")));
  EXPECT_EQ(b->stat("x/.metadata"), 4u);
  EXPECT_FALSE(other->try_stat("x/.metadata"));
  EXPECT_EQ(a->url(), "memory://shared-test");
  EXPECT_EQ(a->describe_key("x/.metadata"), "memory object \"memory://shared-test/x/.metadata\"");
  a.reset();
  b.reset();
  EXPECT_EQ(open_memory_storage(Location::parse("memory://shared-test"), {})->stat("x/.metadata"),
            4u);  // outlives its storages
  drop_memory_storage("shared-test");
  EXPECT_TRUE(open_memory_storage(Location::parse("memory://shared-test"), {})->list("").empty());
}

TEST(MemoryStorageTest, FeaturesAndUrlErrors) {
  auto s = open_memory_storage(Location::parse("memory://"), {});
  StorageFeatures f = s->features();
  EXPECT_TRUE(f.range_reads);
  EXPECT_TRUE(f.atomic_publish);
  EXPECT_TRUE(f.parallel_writes);
  EXPECT_FALSE(f.direct_io);
  EXPECT_FALSE(f.local_path);
  EXPECT_FALSE(s->local_path("k"));
  EXPECT_THROW(open_memory_storage(Location::parse("memory://x?y=1"), {}), UsageError);
  EXPECT_THROW(open_memory_storage(Location::parse("file:///x"), {}), UsageError);
}

TEST(MemoryStorageTest, SourceIsZeroCopy) {
  auto s = open_memory_storage(Location::parse("memory://"), {});
  s->write_atomic("k", as_bytes(std::string_view("abcdef")));
  auto source = s->open_source("k");
  auto view = source->view(1, 3, "x");
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(as_chars(*view), "bcd");
}

}  // namespace
}  // namespace shardpoint::storage
