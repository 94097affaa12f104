// Per-rank metadata (metadata_files.h, docs/dcp-format.md §1.4) over MemoryStorage: the
// union of __0.metadata and __1.metadata (sharded chunks merged, a replicated tensor and an
// object taken once, from the lowest rank, the saver's key order kept); `.metadata` wins
// when present; a missing rank's file, named by a data file or a higher rank's metadata, is
// one error naming it (a whole rank lost too, rank 0 included); ranks that disagree on a tensor are refused; an empty
// folder is not a checkpoint.
#include "engine/metadata_files.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/metadata_codec.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "storage/memory_storage.h"

namespace shardpoint::engine {
namespace {

using format::ChunkStorageMetadata;
using format::Metadata;
using format::MetadataIndex;
using format::StorageInfo;
using format::TensorStorageMetadata;

// What rank r of 2 writes with use_collectives=False: its half of "w" (4 x 2), all of the
// replicated "b" and the object "epoch", in files __r_0.distcp.
Metadata rank_metadata(int r) {
  Metadata md;
  const std::string file = "__" + std::to_string(r) + "_0.distcp";
  TensorStorageMetadata w;
  w.size = {4, 2};
  w.chunks = {ChunkStorageMetadata{{std::int64_t{2} * r, 0}, {2, 2}}};
  md.state_dict_metadata["w"] = w;
  TensorStorageMetadata b;
  b.size = {3};
  b.chunks = {ChunkStorageMetadata{{0}, {3}}};
  md.state_dict_metadata["b"] = b;
  md.state_dict_metadata["epoch"] = format::BytesStorageMetadata{};
  md.key_order = {"w", "b", "epoch"};
  md.storage_data[MetadataIndex{"epoch", std::nullopt, std::nullopt}] = StorageInfo{file, 0, 100, {}};
  md.storage_data[MetadataIndex{"w", Shape{std::int64_t{2} * r, 0}, std::nullopt}] = StorageInfo{file, 100, 700, {}};
  md.storage_data[MetadataIndex{"b", Shape{0}, std::nullopt}] = StorageInfo{file, 800, 600, {}};
  return md;
}

std::unique_ptr<storage::Storage> per_rank_folder(int ranks) {
  auto st = storage::open_memory_storage(Location::parse("memory://"), {});
  for (int r = 0; r < ranks; ++r) {
    st->write_atomic("__" + std::to_string(r) + ".metadata", as_bytes(format::encode_metadata(rank_metadata(r))));
    st->write_atomic("__" + std::to_string(r) + "_0.distcp", as_bytes(std::string(1400, 'x')));
  }
  return st;
}

TEST(MetadataFilesTest, UnionOfRankFiles) {
  auto st = per_rank_folder(2);
  EXPECT_TRUE(has_checkpoint_metadata(*st));
  const Metadata md = format::decode_metadata(as_bytes(read_checkpoint_metadata(*st)), "union");
  EXPECT_EQ(md.key_order, (std::vector<std::string>{"w", "b", "epoch"}));
  const auto& w = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("w"));
  ASSERT_EQ(w.chunks.size(), 2u);
  EXPECT_EQ(w.chunks[0].offsets, (Shape{0, 0}));
  EXPECT_EQ(w.chunks[1].offsets, (Shape{2, 0}));
  EXPECT_EQ(std::get<TensorStorageMetadata>(md.state_dict_metadata.at("b")).chunks.size(), 1u);
  EXPECT_EQ(md.storage_data.size(), 4u);
  EXPECT_EQ(md.storage_data.at(MetadataIndex{"w", Shape{2, 0}, std::nullopt}).relative_path, "__1_0.distcp");
  EXPECT_EQ(md.storage_data.at(MetadataIndex{"b", Shape{0}, std::nullopt}).relative_path, "__0_0.distcp");
  EXPECT_EQ(md.storage_data.at(MetadataIndex{"epoch", std::nullopt, std::nullopt}).relative_path, "__0_0.distcp");
  EXPECT_TRUE(format::check_metadata(md).empty());
  // `.metadata` is the checkpoint when there is one.
  Metadata single = rank_metadata(0);
  st->write_atomic(kMetadataKey, as_bytes(format::encode_metadata(single)));
  EXPECT_EQ(read_checkpoint_metadata(*st), format::encode_metadata(single));
}

TEST(MetadataFilesTest, MissingRankFileIsOneErrorNamingIt) {
  for (const std::string gone : {"__1.metadata", "__0.metadata"}) {
    auto st = per_rank_folder(3);
    st->remove(gone);
    try {
      (void)read_checkpoint_metadata(*st);
      ADD_FAILURE() << gone;
    } catch (const FormatError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(gone + "\": missing"), std::string::npos) << what;
      EXPECT_NE(what.find("at least 3 ranks"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  // Only a data file shows rank 2.
  auto st = per_rank_folder(2);
  st->write_atomic("__2_0.distcp", as_bytes(std::string("x")));
  EXPECT_THROW((void)read_checkpoint_metadata(*st), FormatError);
  // Nothing at all.
  auto empty = storage::open_memory_storage(Location::parse("memory://"), {});
  EXPECT_FALSE(has_checkpoint_metadata(*empty));
  EXPECT_EQ(try_read_checkpoint_metadata(*empty), std::nullopt);
  try {
    (void)read_checkpoint_metadata(*empty);
    ADD_FAILURE();
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kNotFound);
  }
}

// The last rank lost (only its data file left), or a whole rank in the middle lost (its
// metadata and data file gone: a gap in the numbers), or rank 0's file lost: one line
// naming the missing file, and the folder is still seen as a checkpoint.
TEST(MetadataFilesTest, WholeRankLostIsOneErrorNamingIt) {
  struct Case {
    int ranks;
    std::vector<std::string> removed;
    std::string named;
    std::string shows;
  };
  const std::vector<Case> cases = {
      {2, {"__1.metadata"}, "__1.metadata", "__1_0.distcp shows at least 2 ranks"},
      {3, {"__1.metadata", "__1_0.distcp"}, "__1.metadata", "at least 3 ranks"},
      {3, {"__0.metadata", "__0_0.distcp"}, "__0.metadata", "at least 3 ranks"},
  };
  for (const Case& c : cases) {
    auto st = per_rank_folder(c.ranks);
    for (const std::string& key : c.removed) st->remove(key);
    EXPECT_TRUE(has_checkpoint_metadata(*st)) << c.named;
    try {
      (void)read_checkpoint_metadata(*st);
      ADD_FAILURE() << c.named;
    } catch (const FormatError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(c.named + "\": missing"), std::string::npos) << what;
      EXPECT_NE(what.find(c.shows), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

TEST(MetadataFilesTest, RanksThatDisagreeAreRefused) {
  std::vector<Metadata> ranks = {rank_metadata(0), rank_metadata(1)};
  std::get<TensorStorageMetadata>(ranks[1].state_dict_metadata.at("w")).size = {5, 2};
  EXPECT_THROW((void)merge_rank_metadata(ranks, {"__0.metadata", "__1.metadata"}), FormatError);
  ranks = {rank_metadata(0), rank_metadata(1)};
  std::get<TensorStorageMetadata>(ranks[1].state_dict_metadata.at("b")).chunks[0].sizes = {2};
  EXPECT_THROW((void)merge_rank_metadata(ranks, {"__0.metadata", "__1.metadata"}), FormatError);
  ranks = {rank_metadata(0), rank_metadata(1)};
  ranks[1].state_dict_metadata["epoch"] = std::get<TensorStorageMetadata>(ranks[1].state_dict_metadata.at("b"));
  try {
    (void)merge_rank_metadata(ranks, {"__0.metadata", "__1.metadata"});
    ADD_FAILURE();
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()), "__1.metadata: \"epoch\" is a tensor, __0.metadata says an object");
  }
}

}  // namespace
}  // namespace shardpoint::engine
