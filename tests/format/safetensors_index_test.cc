// The sharded safetensors layout: grouping by size, file names, the index text.
#include "format/safetensors_index.h"

#include <gtest/gtest.h>

namespace shardpoint::format {
namespace {

using Files = std::vector<std::vector<std::size_t>>;

TEST(SafetensorsIndexTest, GroupsInOrderUpToTheLimit) {
  EXPECT_EQ(group_into_shards({4, 4, 4}, 0), (Files{{0, 1, 2}}));
  EXPECT_EQ(group_into_shards({4, 4, 4}, 8), (Files{{0, 1}, {2}}));
  // A tensor larger than the limit gets a file of its own.
  EXPECT_EQ(group_into_shards({2, 20, 2}, 8), (Files{{0}, {1}, {2}}));
  EXPECT_EQ(group_into_shards({20, 2}, 8), (Files{{0}, {1}}));
  EXPECT_EQ(group_into_shards({}, 8), (Files{{}}));
}

TEST(SafetensorsIndexTest, NamesAndIndexText) {
  EXPECT_EQ(safetensors_shard_name(0, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(safetensors_index_json(12, {{"b", "f2"}, {"a", "f1"}}),
            "{\n  \"metadata\": {\n    \"total_size\": 12\n  },\n  \"weight_map\": {\n    \"a\": \"f1\",\n"
            "    \"b\": \"f2\"\n  }\n}\n");
}

}  // namespace
}  // namespace shardpoint::format
