// The Metadata content the format tests write and expect back. metadata_oracle.py
// (stub-write) writes the same content with Python's pickler.
#pragma once

#include <gtest/gtest.h>

#include "shardpoint/metadata.h"

namespace shardpoint::format::testing {

// model.w float32 [4, 6] in two row chunks; model.b bfloat16 [6] (requires_grad); s int64
// 0-dim; step a bytes item. planner_data has one nested path and one entry (opt.0.lr) for
// an fqn that is not in state_dict_metadata, as PyTorch's merged mapping can have.
inline Metadata sample_metadata(bool with_transforms = false) {
  Metadata md;
  TensorStorageMetadata w;
  w.properties.dtype = DType::kFloat32;
  w.size = {4, 6};
  w.chunks = {{{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}};
  TensorStorageMetadata b;
  b.properties.dtype = DType::kBFloat16;
  b.properties.requires_grad = true;
  b.size = {6};
  b.chunks = {{{0}, {6}}};
  TensorStorageMetadata s;
  s.properties.dtype = DType::kInt64;
  s.chunks = {{{}, {}}};
  md.state_dict_metadata.emplace("model.w", w);
  md.state_dict_metadata.emplace("model.b", b);
  md.state_dict_metadata.emplace("s", s);
  md.state_dict_metadata.emplace("step", BytesStorageMetadata{});
  md.planner_data = {{"model.w", {std::string("model"), std::string("w")}},
                     {"model.b", {std::string("model"), std::string("b")}},
                     {"s", {std::string("s")}},
                     {"step", {std::string("step")}},
                     {"opt.0.lr", {std::string("opt"), std::int64_t{0}, std::string("lr")}}};
  StorageInfo w0{"__0_0.distcp", 0, 700, {}};
  if (with_transforms) w0.transform_descriptors = {"stream.zstd/1"};
  md.storage_data.emplace(MetadataIndex{"model.w", Shape{0, 0}, 0}, w0);
  md.storage_data.emplace(MetadataIndex{"model.w", Shape{2, 0}, 1}, StorageInfo{"__1_0.distcp", 0, 700, {}});
  md.storage_data.emplace(MetadataIndex{"model.b", Shape{0}, 0}, StorageInfo{"__0_0.distcp", 700, 747, {}});
  md.storage_data.emplace(MetadataIndex{"s", Shape{}, 0}, StorageInfo{"__0_0.distcp", 1447, 747, {}});
  md.storage_data.emplace(MetadataIndex{"step", std::nullopt, std::nullopt},
                          StorageInfo{"__0_0.distcp", 2194, 431, {}});
  return md;
}

// Checks md against sample_metadata(): every field, including the index hints.
inline void expect_sample(const Metadata& md, bool with_planner_data, bool with_transforms) {
  const Metadata want = sample_metadata(with_transforms);
  EXPECT_EQ(md.state_dict_metadata, want.state_dict_metadata);
  EXPECT_EQ(md.storage_data, want.storage_data);
  ASSERT_EQ(md.storage_data.size(), want.storage_data.size());
  for (auto a = md.storage_data.begin(), b = want.storage_data.begin(); a != md.storage_data.end(); ++a, ++b) {
    EXPECT_EQ(a->first.fqn, b->first.fqn);
    EXPECT_EQ(a->first.offset, b->first.offset) << a->first.fqn;
    EXPECT_EQ(a->first.index, b->first.index) << a->first.fqn;
    EXPECT_EQ(a->second.transform_descriptors, b->second.transform_descriptors) << a->first.fqn;
  }
  if (with_planner_data) {
    EXPECT_EQ(md.planner_data, want.planner_data);
    EXPECT_NE(md.planner_data_raw, nullptr);
  } else {
    EXPECT_TRUE(md.planner_data.empty());
    EXPECT_EQ(md.planner_data_raw, nullptr);
  }
}

}  // namespace shardpoint::format::testing
