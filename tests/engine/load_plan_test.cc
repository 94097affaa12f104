#include "engine/load_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <span>

#include "engine/chunking.h"
#include "engine/engine_test_util.h"
#include "engine/save_plan.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

using testing::obj;
using testing::objf;
using testing::shard;
using testing::whole;
using Boxes = std::vector<std::pair<Shape, Shape>>;

// Rows [i*rows, (i+1)*rows) of a [n, cols] tensor for i in [0, n / rows).
Boxes row_blocks(std::int64_t n, std::int64_t cols, std::int64_t ranks) {
  return shard_boxes({n, cols}, {ranks}, {Placement::shard(0)});
}

// Metadata as make_global_save_plan builds it for one tensor saved in `boxes`.
format::Metadata saved(const std::string& fqn, const Shape& global, const Boxes& boxes, DType dtype = DType::kFloat32) {
  std::vector<SavePlan> plans;
  for (std::size_t r = 0; r < boxes.size(); ++r) {
    FlatStateDict flat;
    flat.items.emplace(fqn, shard(global, boxes[r].first, boxes[r].second, dtype));
    flat.planner_data.emplace(fqn, ObjectPath{fqn});
    plans.push_back(make_local_save_plan(flat, static_cast<int>(r)));
  }
  return make_global_save_plan(std::move(plans)).metadata;
}

FlatStateDict request(const std::string& fqn, const TensorShard& t) {
  FlatStateDict flat;
  flat.items.emplace(fqn, t);
  flat.planner_data.emplace(fqn, ObjectPath{fqn});
  return flat;
}

// dest offsets, storage chunk offsets, storage offsets, lengths.
struct Expected {
  Shape dest_offsets;
  Shape chunk_offsets;
  Shape storage_offsets;
  Shape lengths;
};

void expect_reads(const LoadPlan& plan, const std::vector<Expected>& expected) {
  ASSERT_EQ(plan.items.size(), expected.size()) << plan.to_string();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const ReadItem& item = plan.items[i];
    EXPECT_EQ(item.dest_offsets, expected[i].dest_offsets) << "read " << i << ": " << item.to_string();
    EXPECT_EQ(item.storage_index.offset, expected[i].chunk_offsets) << "read " << i << ": " << item.to_string();
    EXPECT_EQ(item.storage_offsets, expected[i].storage_offsets) << "read " << i << ": " << item.to_string();
    EXPECT_EQ(item.lengths, expected[i].lengths) << "read " << i << ": " << item.to_string();
  }
  EXPECT_TRUE(plan.problems.empty()) << plan.to_string();
}

LoadPlan plan_for_box(const format::Metadata& md, const Shape& global, const std::pair<Shape, Shape>& box,
                      DType dtype = DType::kFloat32) {
  return make_load_plan(md, request("w", shard(global, box.first, box.second, dtype)));
}

TEST(LoadPlanResharding, EightToFour) {
  format::Metadata md = saved("w", {16, 4}, row_blocks(16, 4, 8));
  Boxes targets = row_blocks(16, 4, 4);
  expect_reads(plan_for_box(md, {16, 4}, targets[0]),
               {{{0, 0}, {0, 0}, {0, 0}, {2, 4}}, {{2, 0}, {2, 0}, {0, 0}, {2, 4}}});
  expect_reads(plan_for_box(md, {16, 4}, targets[1]),
               {{{0, 0}, {4, 0}, {0, 0}, {2, 4}}, {{2, 0}, {6, 0}, {0, 0}, {2, 4}}});
  expect_reads(plan_for_box(md, {16, 4}, targets[3]),
               {{{0, 0}, {12, 0}, {0, 0}, {2, 4}}, {{2, 0}, {14, 0}, {0, 0}, {2, 4}}});
  LoadPlan plan = plan_for_box(md, {16, 4}, targets[1]);
  EXPECT_EQ(plan.items[0].storage_index.index, 2);  // chunk position in the metadata
  EXPECT_EQ(plan.items[0].dest_index, (format::MetadataIndex{"w", Shape{4, 0}, 0}));
  EXPECT_EQ(plan.items[1].to_string(), "tensor \"w\" [2:4, 0:4] <- chunk #3 at [6, 0] [0:2, 0:4]");
}

TEST(LoadPlanResharding, FourToEight) {
  format::Metadata md = saved("w", {16, 4}, row_blocks(16, 4, 4));
  Boxes targets = row_blocks(16, 4, 8);
  expect_reads(plan_for_box(md, {16, 4}, targets[0]), {{{0, 0}, {0, 0}, {0, 0}, {2, 4}}});
  expect_reads(plan_for_box(md, {16, 4}, targets[1]), {{{0, 0}, {0, 0}, {2, 0}, {2, 4}}});
  expect_reads(plan_for_box(md, {16, 4}, targets[3]), {{{0, 0}, {4, 0}, {2, 0}, {2, 4}}});
  expect_reads(plan_for_box(md, {16, 4}, targets[6]), {{{0, 0}, {12, 0}, {0, 0}, {2, 4}}});
}

TEST(LoadPlanResharding, FourToThree) {
  // Saved rows 4 + 4 + 4 + 4; loaded with ceil(16 / 3) = 6: rows 6 + 6 + 4.
  format::Metadata md = saved("w", {16, 4}, row_blocks(16, 4, 4));
  Boxes targets = row_blocks(16, 4, 3);
  ASSERT_EQ(targets, (Boxes{{{0, 0}, {6, 4}}, {{6, 0}, {6, 4}}, {{12, 0}, {4, 4}}}));
  expect_reads(plan_for_box(md, {16, 4}, targets[0]),
               {{{0, 0}, {0, 0}, {0, 0}, {4, 4}}, {{4, 0}, {4, 0}, {0, 0}, {2, 4}}});
  expect_reads(plan_for_box(md, {16, 4}, targets[1]),
               {{{0, 0}, {4, 0}, {2, 0}, {2, 4}}, {{2, 0}, {8, 0}, {0, 0}, {4, 4}}});
  expect_reads(plan_for_box(md, {16, 4}, targets[2]), {{{0, 0}, {12, 0}, {0, 0}, {4, 4}}});
}

TEST(LoadPlanResharding, UnevenTenRowsThreeToFour) {
  // Saved 4 + 4 + 2, loaded 3 + 3 + 3 + 1.
  format::Metadata md = saved("w", {10, 2}, row_blocks(10, 2, 3));
  Boxes targets = row_blocks(10, 2, 4);
  expect_reads(plan_for_box(md, {10, 2}, targets[0]), {{{0, 0}, {0, 0}, {0, 0}, {3, 2}}});
  expect_reads(plan_for_box(md, {10, 2}, targets[1]),
               {{{0, 0}, {0, 0}, {3, 0}, {1, 2}}, {{1, 0}, {4, 0}, {0, 0}, {2, 2}}});
  expect_reads(plan_for_box(md, {10, 2}, targets[2]),
               {{{0, 0}, {4, 0}, {2, 0}, {2, 2}}, {{2, 0}, {8, 0}, {0, 0}, {1, 2}}});
  expect_reads(plan_for_box(md, {10, 2}, targets[3]), {{{0, 0}, {8, 0}, {1, 0}, {1, 2}}});
}

TEST(LoadPlanResharding, UnevenTenRowsFourToThreeWithEmptySavedChunk) {
  // 10 rows over 4 and back over 3; a saved empty chunk (e.g. 2 rows over 4) is skipped.
  format::Metadata md = saved("w", {10, 2}, row_blocks(10, 2, 4));
  Boxes targets = row_blocks(10, 2, 3);
  expect_reads(plan_for_box(md, {10, 2}, targets[0]),
               {{{0, 0}, {0, 0}, {0, 0}, {3, 2}}, {{3, 0}, {3, 0}, {0, 0}, {1, 2}}});
  expect_reads(plan_for_box(md, {10, 2}, targets[2]),
               {{{0, 0}, {6, 0}, {2, 0}, {1, 2}}, {{1, 0}, {9, 0}, {0, 0}, {1, 2}}});

  // 2 rows over 4: two empty chunks, both at offset [2], are one index after dedup.
  format::Metadata tiny = saved("t", {2}, shard_boxes({2}, {4}, {Placement::shard(0)}));
  EXPECT_EQ(std::get<format::TensorStorageMetadata>(tiny.state_dict_metadata.at("t")).chunks.size(), 3u);
  LoadPlan plan = make_load_plan(tiny, request("t", whole({2})));
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.items[1].storage_index.offset, Shape{1});
}

TEST(LoadPlanResharding, DimOneSharding) {
  // Saved Shard(1) over 2 (cols 3 + 3), loaded Shard(1) over 3 (cols 2 + 2 + 2).
  format::Metadata md = saved("w", {4, 6}, shard_boxes({4, 6}, {2}, {Placement::shard(1)}));
  Boxes targets = shard_boxes({4, 6}, {3}, {Placement::shard(1)});
  expect_reads(plan_for_box(md, {4, 6}, targets[1]),
               {{{0, 0}, {0, 0}, {0, 2}, {4, 1}}, {{0, 1}, {0, 3}, {0, 0}, {4, 1}}});
  // Loaded Shard(0) over 2 instead: each row block takes the matching rows of both column chunks.
  Boxes rows = shard_boxes({4, 6}, {2}, {Placement::shard(0)});
  expect_reads(plan_for_box(md, {4, 6}, rows[1]), {{{0, 0}, {0, 0}, {2, 0}, {2, 3}}, {{0, 3}, {0, 3}, {2, 0}, {2, 3}}});
}

TEST(LoadPlanResharding, TwoDimensionalMeshToOneRank) {
  format::Metadata md = saved("w", {5, 6}, shard_boxes({5, 6}, {2, 2}, {Placement::shard(0), Placement::shard(1)}));
  expect_reads(make_load_plan(md, request("w", whole({5, 6}))), {{{0, 0}, {0, 0}, {0, 0}, {3, 3}},
                                                                 {{0, 3}, {0, 3}, {0, 0}, {3, 3}},
                                                                 {{3, 0}, {3, 0}, {0, 0}, {2, 3}},
                                                                 {{3, 3}, {3, 3}, {0, 0}, {2, 3}}});
  // Onto a 1-D mesh sharding dim 1 over 3: coordinate 1 holds cols [2, 4).
  Boxes targets = shard_boxes({5, 6}, {3}, {Placement::shard(1)});
  expect_reads(plan_for_box(md, {5, 6}, targets[1]), {{{0, 0}, {0, 0}, {0, 2}, {3, 1}},
                                                      {{0, 1}, {0, 3}, {0, 0}, {3, 1}},
                                                      {{3, 0}, {3, 0}, {0, 2}, {2, 1}},
                                                      {{3, 1}, {3, 3}, {0, 0}, {2, 1}}});
}

TEST(LoadPlanResharding, ZeroDimTensor) {
  format::Metadata md = saved("s", {}, {{{}, {}}, {{}, {}}});
  LoadPlan plan = make_load_plan(md, request("s", whole({})));
  expect_reads(plan, {{{}, {}, {}, {}}});
  EXPECT_EQ(saved_chunk_byte_ranges(plan.items[0], {}, 4), (std::vector<ByteRange>{{0, 4}}));
  EXPECT_EQ(dest_byte_ranges(plan.items[0], {}, 4), (std::vector<ByteRange>{{0, 4}}));
}

TEST(LoadPlanResharding, EmptyBoxesAndZeroSizedTensorsNeedNoReads) {
  // A rank whose DTensor piece is empty plans nothing and reports nothing.
  format::Metadata md = saved("w", {2, 3}, row_blocks(2, 3, 2));
  LoadPlan empty_piece = make_load_plan(md, request("w", shard({2, 3}, {2, 0}, {0, 3})));
  EXPECT_TRUE(empty_piece.items.empty());
  EXPECT_TRUE(empty_piece.problems.empty());
  // A [0, 4] tensor saves one empty chunk and loads with no reads.
  format::Metadata zero = saved("z", {0, 4}, {{{0, 0}, {0, 4}}});
  LoadPlan plan = make_load_plan(zero, request("z", whole({0, 4})));
  EXPECT_TRUE(plan.items.empty());
  EXPECT_TRUE(plan.problems.empty());
}

TEST(LoadPlan, BytesItemsAreReadWhole) {
  format::Metadata md;
  md.state_dict_metadata.emplace("step", format::BytesStorageMetadata{});
  FlatStateDict flat;
  flat.items.emplace("step", pickle::Value::none());
  LoadPlan plan = make_load_plan(md, flat);
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].type, ReadItemType::kBytes);
  EXPECT_EQ(plan.items[0].storage_index, (format::MetadataIndex{"step", std::nullopt, std::nullopt}));
  EXPECT_FALSE(plan.items[0].storage_index.offset.has_value());
  EXPECT_EQ(plan.items[0].to_string(), "bytes \"step\"");
  EXPECT_TRUE(saved_chunk_byte_ranges(plan.items[0], {}, 1).empty());
}

// Checkpoint: a float32[4], b float32[4], c float32[4], d bytes, e bytes, ok float32[2].
format::Metadata mixed_checkpoint() {
  format::Metadata md;
  for (const char* fqn : {"b", "c", "ok"}) {
    format::TensorStorageMetadata t;
    t.size = std::string(fqn) == "ok" ? Shape{2} : Shape{4};
    t.chunks = {{{0}, t.size}};
    md.state_dict_metadata.emplace(fqn, t);
  }
  md.state_dict_metadata.emplace("d", format::BytesStorageMetadata{});
  md.state_dict_metadata.emplace("e", format::BytesStorageMetadata{});
  return md;
}

FlatStateDict mixed_request() {
  FlatStateDict flat;
  flat.items.emplace("a", whole({4}));                    // missing
  flat.items.emplace("b", whole({4}, DType::kBFloat16));  // dtype mismatch
  flat.items.emplace("c", whole({5}));                    // shape mismatch
  flat.items.emplace("d", whole({1}));                    // saved as bytes
  flat.items.emplace("ok", whole({2}));
  return flat;  // "e" is in the checkpoint only
}

TEST(LoadPlanProblems, StrictListsEveryProblemInOneError) {
  try {
    make_load_plan(mixed_checkpoint(), mixed_request());
    FAIL() << "expected PlanError";
  } catch (const PlanError& e) {
    EXPECT_STREQ(e.what(), "checkpoint cannot satisfy the load request (4 problems):\n"
                           "  \"a\": missing from the checkpoint: expected tensor float32[4], found nothing\n"
                           "  \"b\": dtype mismatch: expected bfloat16, found float32\n"
                           "  \"c\": global shape mismatch: expected [5], found [4]\n"
                           "  \"d\": type mismatch: expected tensor float32[1], found bytes");
  }
}

TEST(LoadPlanProblems, NonStrictReturnsProblemsAndPlansTheRest) {
  LoadPlan plan = make_load_plan(mixed_checkpoint(), mixed_request(), LoadPlanOptions{.strict = false});
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].dest_index.fqn, "ok");
  using Kind = LoadProblem::Kind;
  EXPECT_EQ(plan.problems, (std::vector<LoadProblem>{
                               {Kind::kMissingKey, "a", "tensor float32[4]", "nothing"},
                               {Kind::kDTypeMismatch, "b", "bfloat16", "float32"},
                               {Kind::kShapeMismatch, "c", "[5]", "[4]"},
                               {Kind::kTypeMismatch, "d", "tensor float32[1]", "bytes"},
                               {Kind::kUnexpectedKey, "e", "nothing", "bytes"},
                           }));
}

TEST(LoadPlanProblems, UnexpectedKeysAreListedButOnlyErrorsWhenAsked) {
  FlatStateDict flat;
  flat.items.emplace("ok", whole({2}));
  format::Metadata md = mixed_checkpoint();
  LoadPlan plan = make_load_plan(md, flat);  // strict, but unexpected keys are fine
  EXPECT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.problems.size(), 4u);  // b, c, d, e
  for (const LoadProblem& p : plan.problems) EXPECT_EQ(p.kind, LoadProblem::Kind::kUnexpectedKey);
  EXPECT_THROW(make_load_plan(md, flat, LoadPlanOptions{.unexpected_keys_are_errors = true}), PlanError);
}

TEST(LoadPlanProblems, IncompleteCoverageIsDetected) {
  format::Metadata md;
  format::TensorStorageMetadata t;
  t.size = {8};
  t.chunks = {{{0}, {3}}, {{4}, {4}}};  // row 3 is missing
  md.state_dict_metadata.emplace("w", t);
  try {
    make_load_plan(md, request("w", whole({8})));
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_STREQ(e.what(),
                 "checkpoint cannot satisfy the load request (1 problem):\n"
                 "  \"w\": saved chunks do not cover the request exactly once: expected 8 elements for box [0:8], "
                 "found 7");
  }
  // A box inside the saved part still loads.
  EXPECT_EQ(make_load_plan(md, request("w", shard({8}, {4}, {4}))).items.size(), 1u);
}

TEST(LoadPlanProblems, RequestedBoxOutsideItsShapeIsAUsageError) {
  EXPECT_THROW(make_load_plan(mixed_checkpoint(), request("ok", shard({2}, {1}, {2}))), UsageError);
}

TEST(FlattenForLoad, PicksTheDcp23RuleForA23EraCheckpoint) {
  StateNode group{StateDict{{"lr", objf(0.1)}}};
  StateNode root{StateDict{
      {"optim", StateNode(StateDict{{"param_groups", StateNode(StateList{group})}, {"w", StateNode(whole({2}))}})}}};
  format::Metadata old_ckpt;
  old_ckpt.state_dict_metadata.emplace("optim.param_groups", format::BytesStorageMetadata{});
  old_ckpt.state_dict_metadata.emplace("optim.w", format::TensorStorageMetadata{});
  EXPECT_EQ(testing::keys_of(flatten_for_load(old_ckpt, root)),
            (std::vector<std::string>{"optim.param_groups", "optim.w"}));

  format::Metadata new_ckpt;
  new_ckpt.state_dict_metadata.emplace("optim.param_groups.0.lr", format::BytesStorageMetadata{});
  new_ckpt.state_dict_metadata.emplace("optim.w", format::TensorStorageMetadata{});
  new_ckpt.state_dict_metadata.emplace("unrelated", format::BytesStorageMetadata{});
  EXPECT_EQ(testing::keys_of(flatten_for_load(new_ckpt, root)),
            (std::vector<std::string>{"optim.param_groups.0.lr", "optim.w"}));
}

TEST(ByteRanges, DimZeroSliceIsOneRun) {
  ReadItem item;
  item.storage_offsets = {1, 0};
  item.lengths = {2, 6};
  item.dest_offsets = {3, 0};
  EXPECT_EQ(saved_chunk_byte_ranges(item, {4, 6}, 4), (std::vector<ByteRange>{{24, 48}}));
  EXPECT_EQ(dest_byte_ranges(item, {5, 6}, 4), (std::vector<ByteRange>{{72, 48}}));
}

TEST(ByteRanges, DimOneSliceIsOneRunPerRow) {
  ReadItem item;
  item.storage_offsets = {0, 2};
  item.lengths = {4, 1};
  item.dest_offsets = {0, 0};
  EXPECT_EQ(saved_chunk_byte_ranges(item, {4, 6}, 4), (std::vector<ByteRange>{{8, 4}, {32, 4}, {56, 4}, {80, 4}}));
  // The destination box is exactly one column wide, so its side is a single run.
  EXPECT_EQ(dest_byte_ranges(item, {4, 1}, 4), (std::vector<ByteRange>{{0, 16}}));
}

TEST(ByteRanges, ThreeDimensionsAndBadInput) {
  ReadItem item;
  item.storage_offsets = {0, 1, 0};
  item.lengths = {2, 2, 4};
  EXPECT_EQ(saved_chunk_byte_ranges(item, {2, 3, 4}, 2), (std::vector<ByteRange>{{8, 16}, {32, 16}}));
  item.storage_offsets = {0, 0, 0};
  item.lengths = {2, 3, 4};
  EXPECT_EQ(saved_chunk_byte_ranges(item, {2, 3, 4}, 2), (std::vector<ByteRange>{{0, 48}}));
  item.lengths = {2, 0, 4};
  EXPECT_TRUE(saved_chunk_byte_ranges(item, {2, 3, 4}, 2).empty());
  item.lengths = {2, 4, 4};
  EXPECT_THROW(saved_chunk_byte_ranges(item, {2, 3, 4}, 2), UsageError);
  item.lengths = {2, 3};
  EXPECT_THROW(saved_chunk_byte_ranges(item, {2, 3, 4}, 2), UsageError);
}

// A full reshard reads every saved byte exactly once and fills every target byte once.
void expect_exact_once(const Shape& global, const Boxes& saved_boxes, const Boxes& target_boxes, DType dtype) {
  format::Metadata md = saved("w", global, saved_boxes, dtype);
  const auto& tensor = std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at("w"));
  const std::size_t itemsize = dtype_itemsize(dtype);
  std::map<std::int64_t, std::vector<ByteRange>> reads_per_chunk;
  std::uint64_t total_saved = 0, total_dest = 0;
  for (const auto& target : target_boxes) {
    LoadPlan plan = plan_for_box(md, global, target, dtype);
    std::uint64_t dest_bytes = 0;
    for (const ReadItem& item : plan.items) {
      const Shape& chunk_sizes = tensor.chunks.at(static_cast<std::size_t>(*item.storage_index.index)).sizes;
      std::uint64_t source = 0, dest = 0;
      for (const ByteRange& r : saved_chunk_byte_ranges(item, chunk_sizes, itemsize)) {
        source += r.length;
        reads_per_chunk[*item.storage_index.index].push_back(r);
      }
      for (const ByteRange& r : dest_byte_ranges(item, target.second, itemsize)) dest += r.length;
      EXPECT_EQ(source, dest) << item.to_string();
      EXPECT_EQ(source, static_cast<std::uint64_t>(volume(item.lengths)) * itemsize);
      total_saved += source;
      dest_bytes += dest;
    }
    EXPECT_EQ(dest_bytes, static_cast<std::uint64_t>(volume(target.second)) * itemsize);
    total_dest += dest_bytes;
  }
  const auto tensor_bytes = static_cast<std::uint64_t>(volume(global)) * itemsize;
  EXPECT_EQ(total_saved, tensor_bytes);
  EXPECT_EQ(total_dest, tensor_bytes);
  // No saved byte is read twice: ranges within a chunk are disjoint and sum to its size.
  for (auto& [position, ranges] : reads_per_chunk) {
    std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      if (i > 0) {
        EXPECT_LE(ranges[i - 1].offset + ranges[i - 1].length, ranges[i].offset);
      }
      sum += ranges[i].length;
    }
    const Shape& sizes = tensor.chunks.at(static_cast<std::size_t>(position)).sizes;
    EXPECT_EQ(sum, static_cast<std::uint64_t>(volume(sizes)) * itemsize);
  }
}

TEST(ByteRanges, FullReshardsReadEachByteExactlyOnce) {
  expect_exact_once({16, 4}, row_blocks(16, 4, 8), row_blocks(16, 4, 4), DType::kFloat32);
  expect_exact_once({16, 4}, row_blocks(16, 4, 4), row_blocks(16, 4, 8), DType::kFloat32);
  expect_exact_once({16, 4}, row_blocks(16, 4, 4), row_blocks(16, 4, 3), DType::kFloat32);
  expect_exact_once({10, 3}, row_blocks(10, 3, 3), row_blocks(10, 3, 4), DType::kBFloat16);
  expect_exact_once({10, 7}, shard_boxes({10, 7}, {2, 2}, {Placement::shard(0), Placement::shard(1)}),
                    shard_boxes({10, 7}, {3}, {Placement::shard(1)}), DType::kFloat64);
  expect_exact_once({6, 5, 4}, shard_boxes({6, 5, 4}, {4}, {Placement::shard(1)}),
                    shard_boxes({6, 5, 4}, {2, 3}, {Placement::shard(2), Placement::shard(0)}), DType::kInt8);
}

// Calls fn with every multi-index of a box of `sizes`, row-major.
template <typename Fn>
void for_each_index(const Shape& sizes, Fn fn) {
  if (volume(sizes) == 0) return;
  Shape index(sizes.size(), 0);
  while (true) {
    fn(index);
    std::size_t d = sizes.size();
    while (d > 0 && ++index[d - 1] == sizes[d - 1]) {
      index[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

std::int32_t global_value(const Shape& global, const Shape& box_offsets, const Shape& local_index) {
  std::int64_t linear = 0;
  for (std::size_t d = 0; d < global.size(); ++d) linear = linear * global[d] + box_offsets[d] + local_index[d];
  return static_cast<std::int32_t>(linear);
}

// A toy executor over the plans: saves a tensor whose elements are their row-major global
// index from `save_boxes`, then loads it into `load_boxes` moving only the planned byte
// runs; every loaded element must be its global index.
void save_then_load(const Shape& global, const Boxes& save_boxes, const Boxes& load_boxes) {
  std::vector<std::vector<std::int32_t>> shard_data(save_boxes.size());
  std::vector<SavePlan> plans;
  for (std::size_t r = 0; r < save_boxes.size(); ++r) {
    // Named, not structured bindings: lambdas cannot capture those before clang 16.
    const Shape& offsets = save_boxes[r].first;
    const Shape& sizes = save_boxes[r].second;
    for_each_index(sizes, [&](const Shape& i) { shard_data[r].push_back(global_value(global, offsets, i)); });
    TensorShard t = shard(global, offsets, sizes, DType::kInt32);
    t.data = std::as_writable_bytes(std::span(shard_data[r]));
    plans.push_back(make_local_save_plan(request("w", t), static_cast<int>(r)));
  }
  GlobalSavePlan saved_plan = make_global_save_plan(plans, SavePlanOptions{.thread_count = 2});
  // "Write": each kept item's bytes, keyed by chunk position.
  std::map<std::int64_t, std::vector<std::byte>> blobs;
  for (const SavePlan& plan : saved_plan.plans) {
    for (const WriteItem& item : plan.items) {
      auto bytes = std::as_bytes(std::span(shard_data[static_cast<std::size_t>(plan.rank)]));
      ASSERT_EQ(bytes.size(), item.nbytes);
      blobs[*item.index.index].assign(bytes.begin(), bytes.end());
    }
  }
  const auto& tensor = std::get<format::TensorStorageMetadata>(saved_plan.metadata.state_dict_metadata.at("w"));
  for (const auto& box : load_boxes) {
    const Shape& offsets = box.first;
    const Shape& sizes = box.second;
    std::vector<std::int32_t> dest(static_cast<std::size_t>(volume(sizes)), -1);
    TensorShard t = shard(global, offsets, sizes, DType::kInt32);
    t.data = std::as_writable_bytes(std::span(dest));
    LoadPlan plan = make_load_plan(saved_plan.metadata, request("w", t));
    std::byte* dest_bytes = reinterpret_cast<std::byte*>(dest.data());
    for (const ReadItem& item : plan.items) {
      const std::vector<std::byte>& blob = blobs.at(*item.storage_index.index);
      const Shape& chunk_sizes = tensor.chunks.at(static_cast<std::size_t>(*item.storage_index.index)).sizes;
      std::vector<std::byte> staging;
      for (const ByteRange& r : saved_chunk_byte_ranges(item, chunk_sizes, 4)) {
        staging.insert(staging.end(), blob.begin() + static_cast<std::ptrdiff_t>(r.offset),
                       blob.begin() + static_cast<std::ptrdiff_t>(r.offset + r.length));
      }
      std::size_t consumed = 0;
      for (const ByteRange& r : dest_byte_ranges(item, sizes, 4)) {
        std::copy_n(staging.begin() + static_cast<std::ptrdiff_t>(consumed), r.length, dest_bytes + r.offset);
        consumed += r.length;
      }
      EXPECT_EQ(consumed, staging.size());
    }
    std::size_t k = 0;
    bool all_equal = true;
    for_each_index(sizes, [&](const Shape& i) { all_equal &= dest[k++] == global_value(global, offsets, i); });
    EXPECT_TRUE(all_equal) << "load box " << box_to_string(offsets, sizes);
  }
}

TEST(SaveThenLoad, ToyExecutorReproducesEveryElement) {
  save_then_load({16, 4}, row_blocks(16, 4, 8), row_blocks(16, 4, 4));
  save_then_load({16, 4}, row_blocks(16, 4, 4), row_blocks(16, 4, 3));
  save_then_load({10, 7}, shard_boxes({10, 7}, {2, 2}, {Placement::shard(0), Placement::shard(1)}),
                 shard_boxes({10, 7}, {3}, {Placement::shard(1)}));
  save_then_load({10, 7}, shard_boxes({10, 7}, {2, 2}, {Placement::replicate(), Placement::shard(1)}),
                 shard_boxes({10, 7}, {4}, {Placement::shard(0)}));
  save_then_load({6, 5, 4}, shard_boxes({6, 5, 4}, {4}, {Placement::shard(1)}),
                 shard_boxes({6, 5, 4}, {2, 3}, {Placement::shard(2), Placement::shard(0)}));
  save_then_load({}, {{{}, {}}, {{}, {}}}, {{{}, {}}});
}

}  // namespace
}  // namespace shardpoint::engine
