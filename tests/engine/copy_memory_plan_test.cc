// plan_copy_memory: the budget split consolidate() uses.
#include "engine/copy_memory_plan.h"

#include <gtest/gtest.h>

namespace shardpoint::engine {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

TEST(CopyMemoryPlanTest, LocalCopyWithRoom) {
  CopyMemoryInputs in;
  in.budget = 256 * kMiB;
  in.base_rss = 20 * kMiB;
  in.header_cache = 1 * kMiB;
  const CopyMemoryPlan plan = plan_copy_memory(in);
  // avail = min(256 - 26, 128) = 128 MiB; a second reader (4 MiB) fits.
  EXPECT_EQ(plan.readers, 2u);
  EXPECT_EQ(plan.pool_bytes, 2 * kMiB);  // 124 / 6 capped at 2 MiB
  EXPECT_EQ(plan.part_bytes, plan.pool_bytes);
  EXPECT_EQ(plan.slab_bytes, 124 * kMiB * 2 / 3);
  EXPECT_EQ(plan.buffer_bytes % 4096, 0u);
  EXPECT_LE(plan.buffer_bytes * in.slab_buffers, plan.slab_bytes);
}

TEST(CopyMemoryPlanTest, RemoteOutputUsesUploadParts) {
  CopyMemoryInputs in;
  in.budget = 256 * kMiB;
  in.base_rss = 20 * kMiB;
  in.remote_output = true;
  const CopyMemoryPlan plan = plan_copy_memory(in);
  EXPECT_EQ(plan.part_bytes, 8 * kMiB);
  EXPECT_EQ(plan.pool_bytes % plan.part_bytes, 0u);
  EXPECT_LE(plan.pool_bytes, 4 * plan.part_bytes);
}

TEST(CopyMemoryPlanTest, TinyBudgetGetsMinimums) {
  CopyMemoryInputs in;
  in.budget = 8 * kMiB;
  in.base_rss = 30 * kMiB;
  const CopyMemoryPlan plan = plan_copy_memory(in);
  EXPECT_EQ(plan.readers, 1u);
  EXPECT_EQ(plan.pool_bytes, std::size_t{64} << 10);
  EXPECT_EQ(plan.slab_bytes, std::size_t{256} << 10);
  EXPECT_EQ(plan.buffer_bytes, std::size_t{64} << 10);
  in.remote_output = true;
  EXPECT_EQ(plan_copy_memory(in).pool_bytes, 5 * kMiB);  // one part, S3's minimum
}

}  // namespace
}  // namespace shardpoint::engine
