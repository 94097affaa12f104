// The load index codec (checkpoint_index.h) on metadata built in memory: every field round
// trips (tensors of every shape kind, objects, planner_data with str and int elements,
// storage entries with transform descriptors, storage_meta modules, version, checksums,
// data offsets); the encoding is deterministic; index_matches binds to the exact
// `.metadata` bytes and refuses any damaged, truncated or extended index; decode refuses
// every truncation with a FormatError naming the source.
#include "engine/checkpoint_index.h"

#include <gtest/gtest.h>

#include "core/checksum.h"
#include "format/metadata_codec.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

format::Metadata sample_metadata() {
  format::Metadata md;
  format::TensorStorageMetadata w;
  w.properties.dtype = DType::kBFloat16;
  w.properties.requires_grad = true;
  w.size = {6, 4};
  w.chunks = {{{0, 0}, {3, 4}}, {{3, 0}, {3, 4}}};
  md.state_dict_metadata["model.w"] = w;
  format::TensorStorageMetadata scalar;
  scalar.chunks = {{{}, {}}};
  md.state_dict_metadata["model.scalar"] = scalar;
  md.state_dict_metadata["epoch"] = format::BytesStorageMetadata{};
  md.planner_data["model.w"] = {std::string("model"), std::string("w")};
  md.planner_data["epoch"] = {std::string("epoch")};
  md.planner_data["groups.0.lr"] = {std::string("groups"), std::int64_t{0}, std::string("lr")};
  md.storage_data[{"model.w", format::Shape{0, 0}, 0}] = {"__0_0.distcp", 0, 1200, {}};
  md.storage_data[{"model.w", format::Shape{3, 0}, 1}] = {"__1_0.distcp", 0, 1200, {"zstd"}};
  md.storage_data[{"model.scalar", format::Shape{}, 0}] = {"__0_0.distcp", 1200, 900, {}};
  md.storage_data[{"epoch", std::nullopt, std::nullopt}] = {"__0_0.distcp", 2100, 700, {}};
  md.storage_meta = format::StorageMeta{std::string("ckpt"), std::string("save-1"), std::nullopt, {"a.b", "c"}};
  md.version = "1.0.0";
  return md;
}

ChecksumSidecar sample_sidecar() {
  ChecksumSidecar s(ChecksumAlgorithm::kCrc32c, 1024);
  s.add(ItemChecksums{"__0_0.distcp", 0, 1200, "model.w", format::Shape{0, 0}, 0x1234, {1, 2}});
  s.add(ItemChecksums{"__0_0.distcp", 2100, 700, "epoch", std::nullopt, 0x99, {7}});
  return s;
}

std::map<format::MetadataIndex, std::uint64_t> sample_offsets() {
  return {{{"model.w", format::Shape{0, 0}, 0}, 448},
          {{"model.w", format::Shape{3, 0}, 1}, 512},
          {{"model.scalar", format::Shape{}, 0}, 384}};
}

TEST(CheckpointIndexTest, EveryFieldRoundTrips) {
  const format::Metadata md = sample_metadata();
  const std::string md_bytes = format::encode_metadata(md);
  const ChecksumSidecar sidecar = sample_sidecar();
  const std::string index = encode_checkpoint_index(md, as_bytes(md_bytes), &sidecar, sample_offsets());
  ASSERT_TRUE(index_matches(index, as_bytes(md_bytes)));
  const CheckpointIndex got = decode_checkpoint_index(index, "idx");
  EXPECT_EQ(got.metadata.state_dict_metadata, md.state_dict_metadata);
  EXPECT_EQ(got.metadata.planner_data, md.planner_data);
  EXPECT_EQ(got.metadata.storage_meta, md.storage_meta);
  EXPECT_EQ(got.metadata.version, md.version);
  ASSERT_EQ(got.metadata.storage_data.size(), md.storage_data.size());
  for (const auto& [key, info] : md.storage_data) {
    auto it = got.metadata.storage_data.find(key);
    ASSERT_NE(it, got.metadata.storage_data.end()) << key.fqn;
    EXPECT_EQ(it->first.index, key.index) << key.fqn;
    EXPECT_EQ(it->second, info) << key.fqn;
  }
  ASSERT_TRUE(got.checksums);
  EXPECT_EQ(got.checksums->algorithm(), ChecksumAlgorithm::kCrc32c);
  EXPECT_EQ(got.checksums->block_size(), 1024u);
  EXPECT_EQ(got.checksums->items(), sidecar.items());
  EXPECT_EQ(got.data_offsets, sample_offsets());
  // Deterministic.
  EXPECT_EQ(encode_checkpoint_index(md, as_bytes(md_bytes), &sidecar, sample_offsets()), index);
}

TEST(CheckpointIndexTest, WithoutChecksumsOrOptionalFields) {
  format::Metadata md = sample_metadata();
  md.storage_meta.reset();
  md.version.reset();
  const std::string md_bytes = format::encode_metadata(md);
  const std::string index = encode_checkpoint_index(md, as_bytes(md_bytes), nullptr, {});
  ASSERT_TRUE(index_matches(index, as_bytes(md_bytes)));
  const CheckpointIndex got = decode_checkpoint_index(index, "idx");
  EXPECT_FALSE(got.checksums);
  EXPECT_FALSE(got.metadata.storage_meta);
  EXPECT_FALSE(got.metadata.version);
  EXPECT_TRUE(got.data_offsets.empty());
}

// Bound to one `.metadata`: its length and CRC-32C.
TEST(CheckpointIndexTest, MatchesOnlyItsMetadataBytes) {
  const format::Metadata md = sample_metadata();
  const std::string md_bytes = format::encode_metadata(md);
  const std::string index = encode_checkpoint_index(md, as_bytes(md_bytes), nullptr, sample_offsets());
  std::string other = md_bytes;
  other[other.size() / 2] ^= 0x01;
  EXPECT_FALSE(index_matches(index, as_bytes(other)));
  EXPECT_FALSE(index_matches(index, as_bytes(md_bytes + " ")));
  EXPECT_FALSE(index_matches(index, as_bytes(md_bytes.substr(1))));
  EXPECT_FALSE(index_matches(index, ByteSpan{}));
}

// Its own CRC-32C catches any flipped byte; truncation and trailing bytes are refused.
TEST(CheckpointIndexTest, DamagedTruncatedOrExtendedIndexDoesNotMatch) {
  const format::Metadata md = sample_metadata();
  const std::string md_bytes = format::encode_metadata(md);
  const ChecksumSidecar sidecar = sample_sidecar();
  const std::string index = encode_checkpoint_index(md, as_bytes(md_bytes), &sidecar, sample_offsets());
  for (std::size_t i = 0; i < index.size(); ++i) {
    std::string damaged = index;
    damaged[i] ^= 0x20;
    EXPECT_FALSE(index_matches(damaged, as_bytes(md_bytes))) << "byte " << i;
  }
  for (std::size_t n = 0; n < index.size(); ++n) {
    EXPECT_FALSE(index_matches(index.substr(0, n), as_bytes(md_bytes))) << "length " << n;
  }
  EXPECT_FALSE(index_matches(index + "x", as_bytes(md_bytes)));
}

TEST(CheckpointIndexTest, DecodeRefusesEveryTruncationNamingTheSource) {
  const format::Metadata md = sample_metadata();
  const std::string md_bytes = format::encode_metadata(md);
  const ChecksumSidecar sidecar = sample_sidecar();
  const std::string index = encode_checkpoint_index(md, as_bytes(md_bytes), &sidecar, sample_offsets());
  for (std::size_t n = 0; n + 4 < index.size(); ++n) {
    try {
      decode_checkpoint_index(index.substr(0, n), "my.index");
      ADD_FAILURE() << "length " << n << " decoded";
    } catch (const FormatError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("my.index", 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace shardpoint::engine
