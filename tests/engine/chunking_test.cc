#include "engine/chunking.h"

#include <gtest/gtest.h>

#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

using Boxes = std::vector<std::pair<Shape, Shape>>;

TEST(ShardBoxes, CeilDivisionWithEmptyLastChunks) {
  // 10 rows over 4: chunk 3 -> 3, 3, 3, 1.
  EXPECT_EQ(shard_boxes({10, 2}, {4}, {Placement::shard(0)}),
            (Boxes{{{0, 0}, {3, 2}}, {{3, 0}, {3, 2}}, {{6, 0}, {3, 2}}, {{9, 0}, {1, 2}}}));
  // 5 rows over 2: 3 + 2 (the ChunkShardingSpec observation of docs/dcp-format.md §4.3).
  EXPECT_EQ(shard_boxes({5}, {2}, {Placement::shard(0)}), (Boxes{{{0}, {3}}, {{3}, {2}}}));
  // 2 rows over 4: chunk 1 -> 1, 1, then empty pieces clamped to the end.
  EXPECT_EQ(shard_boxes({2}, {4}, {Placement::shard(0)}), (Boxes{{{0}, {1}}, {{1}, {1}}, {{2}, {0}}, {{2}, {0}}}));
  // 9 over 4: chunk 3 -> 3, 3, 3, 0.
  EXPECT_EQ(shard_boxes({9}, {4}, {Placement::shard(0)}), (Boxes{{{0}, {3}}, {{3}, {3}}, {{6}, {3}}, {{9}, {0}}}));
}

TEST(ShardBoxes, ShardOnDim1AndReplicate) {
  EXPECT_EQ(shard_boxes({4, 6}, {3}, {Placement::shard(1)}),
            (Boxes{{{0, 0}, {4, 2}}, {{0, 2}, {4, 2}}, {{0, 4}, {4, 2}}}));
  EXPECT_EQ(shard_boxes({4, 6}, {2}, {Placement::replicate()}), (Boxes{{{0, 0}, {4, 6}}, {{0, 0}, {4, 6}}}));
}

TEST(ShardBoxes, TwoDimensionalMeshRowMajorCoordinates) {
  // Mesh 2x2, Shard(0) on mesh dim 0, Shard(1) on mesh dim 1: a 2x2 grid of tiles.
  EXPECT_EQ(shard_boxes({4, 6}, {2, 2}, {Placement::shard(0), Placement::shard(1)}),
            (Boxes{{{0, 0}, {2, 3}}, {{0, 3}, {2, 3}}, {{2, 0}, {2, 3}}, {{2, 3}, {2, 3}}}));
  // FSDP x TP style: replicate over mesh dim 0, shard dim 0 over mesh dim 1.
  EXPECT_EQ(shard_boxes({4, 2}, {2, 2}, {Placement::replicate(), Placement::shard(0)}),
            (Boxes{{{0, 0}, {2, 2}}, {{2, 0}, {2, 2}}, {{0, 0}, {2, 2}}, {{2, 0}, {2, 2}}}));
}

TEST(ShardBoxes, SameTensorDimNestsLeftToRight) {
  // 10 rows, mesh 2x2 both Shard(0): 5 + 5, then each 5 -> 3 + 2.
  EXPECT_EQ(shard_boxes({10}, {2, 2}, {Placement::shard(0), Placement::shard(0)}),
            (Boxes{{{0}, {3}}, {{3}, {2}}, {{5}, {3}}, {{8}, {2}}}));
}

TEST(ShardBoxes, ZeroDimTensorIsReplicated) {
  EXPECT_EQ(shard_boxes({}, {3}, {Placement::replicate()}), (Boxes{{{}, {}}, {{}, {}}, {{}, {}}}));
}

TEST(ShardBoxes, BadArgumentsAreUsageErrors) {
  EXPECT_THROW(shard_boxes({4}, {2}, {Placement::shard(1)}), UsageError);
  EXPECT_THROW(shard_boxes({4}, {2, 2}, {Placement::shard(0)}), UsageError);
  EXPECT_THROW(shard_boxes({4}, {0}, {Placement::shard(0)}), UsageError);
  EXPECT_THROW(shard_box({4}, {2}, {Placement::shard(0)}, {2}), UsageError);
}

TEST(Boxes, OverlapIsStrict) {
  EXPECT_TRUE(boxes_overlap(Box{{0, 0}, {2, 2}}, Box{{1, 1}, {2, 2}}));
  EXPECT_FALSE(boxes_overlap(Box{{0, 0}, {2, 2}}, Box{{2, 0}, {2, 2}}));  // touching
  EXPECT_FALSE(boxes_overlap(Box{{0, 0}, {2, 2}}, Box{{0, 0}, {0, 2}}));  // empty
  EXPECT_TRUE(boxes_overlap(Box{{}, {}}, Box{{}, {}}));
  EXPECT_EQ(intersect(Box{{0, 0}, {4, 4}}, Box{{2, 3}, {4, 4}}), (Box{{2, 3}, {2, 1}}));
  EXPECT_EQ(volume({}), 1);
  EXPECT_EQ(volume({3, 0}), 0);
  EXPECT_EQ(box_to_string({4, 0}, {4, 3}), "[4:8, 0:3]");
  EXPECT_EQ(shape_to_string({8, 3}), "[8, 3]");
}

TEST(ForEachBox, CoversRowMajor) {
  std::vector<std::pair<Shape, Shape>> boxes;
  auto collect = [&](const Shape& o, const Shape& s, std::uint64_t n) {
    boxes.emplace_back(o, s);
    std::uint64_t v = 4;
    for (auto d : s) v *= static_cast<std::uint64_t>(d);
    EXPECT_EQ(v, n);
    EXPECT_LE(n, 48u);
  };
  for_each_box({5, 3}, 4, 30, collect);  // 2 rows of 12 bytes per box
  EXPECT_EQ(boxes, (std::vector<std::pair<Shape, Shape>>{{{0, 0}, {2, 3}}, {{2, 0}, {2, 3}}, {{4, 0}, {1, 3}}}));
  boxes.clear();
  for_each_box({2, 10}, 4, 16, collect);  // rows of 40 bytes: split along dim 1
  ASSERT_EQ(boxes.size(), 6u);
  EXPECT_EQ(boxes[0], (std::pair<Shape, Shape>{{0, 0}, {1, 4}}));
  EXPECT_EQ(boxes[2], (std::pair<Shape, Shape>{{0, 8}, {1, 2}}));
  EXPECT_EQ(boxes[3], (std::pair<Shape, Shape>{{1, 0}, {1, 4}}));
  boxes.clear();
  for_each_box({}, 4, 16, collect);
  EXPECT_EQ(boxes.size(), 1u);
  boxes.clear();
  for_each_box({3, 0}, 4, 16, collect);
  EXPECT_TRUE(boxes.empty());
}

}  // namespace
}  // namespace shardpoint::engine
