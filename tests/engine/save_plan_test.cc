#include "engine/save_plan.h"

#include <gtest/gtest.h>

#include "engine/chunking.h"
#include "engine/engine_test_util.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

using testing::obj;
using testing::shard;
using testing::whole;

// One flat state dict per rank.
std::vector<SavePlan> local_plans(const std::vector<FlatStateDict>& ranks) {
  std::vector<SavePlan> plans;
  for (std::size_t r = 0; r < ranks.size(); ++r) plans.push_back(make_local_save_plan(ranks[r], static_cast<int>(r)));
  return plans;
}

FlatStateDict flat_of(std::vector<std::pair<std::string, FlatValue>> leaves) {
  FlatStateDict flat;
  for (auto& [fqn, leaf] : leaves) {
    flat.planner_data.emplace(fqn, ObjectPath{fqn});
    flat.items.emplace(fqn, std::move(leaf));
  }
  return flat;
}

// fqn@offsets of every item of a plan, in plan order.
std::vector<std::string> item_names(const SavePlan& plan) {
  std::vector<std::string> names;
  for (const WriteItem& item : plan.items) {
    std::string name = item.index.fqn;
    if (item.index.offset && !item.index.offset->empty()) name += "@" + std::to_string(item.index.offset->front());
    names.push_back(name);
  }
  return names;
}

std::string plan_error(const std::vector<SavePlan>& plans, const SavePlanOptions& options = {}) {
  try {
    make_global_save_plan(plans, options);
  } catch (const PlanError& e) {
    return e.what();
  }
  return "no error";
}

TEST(LocalSavePlan, OneItemPerLeafInFqnOrder) {
  StateNode root{StateDict{{"step", obj(3)}, {"w", StateNode(shard({8, 3}, {4, 0}, {4, 3}, DType::kBFloat16))}}};
  SavePlan plan = make_local_save_plan(flatten_state_dict(root), 1);
  EXPECT_EQ(plan.rank, 1);
  ASSERT_EQ(plan.items.size(), 2u);

  WriteItem step;
  step.index = format::MetadataIndex{"step", std::nullopt, std::nullopt};
  step.type = WriteItemType::kBytes;
  EXPECT_EQ(plan.items[0], step);

  WriteItem w;
  w.index = format::MetadataIndex{"w", Shape{4, 0}, std::nullopt};
  w.type = WriteItemType::kTensor;
  w.dtype = DType::kBFloat16;
  w.global_size = {8, 3};
  w.chunk = {{4, 0}, {4, 3}};
  w.nbytes = 24;
  EXPECT_EQ(plan.items[1], w);
  EXPECT_EQ(plan.items[1].to_string(), "tensor \"w\" [4:8, 0:3] of bfloat16[8, 3] (24 B)");
  EXPECT_EQ(plan.planner_data.at("w"), (ObjectPath{"w"}));
}

TEST(LocalSavePlan, InconsistentShardsAreUsageErrors) {
  EXPECT_THROW(make_local_save_plan(flat_of({{"w", shard({8}, {6}, {4})}}), 0), UsageError);
  EXPECT_THROW(make_local_save_plan(flat_of({{"w", shard({8, 2}, {0}, {8})}}), 0), UsageError);
  std::vector<std::byte> buffer(10);
  TensorShard t = whole({4});
  t.data = buffer;  // 10 bytes, 16 needed
  try {
    make_local_save_plan(flat_of({{"w", t}}), 0);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "tensor \"w\": data holds 10 bytes, box [0:4] of float32 needs 16");
  }
}

TEST(GlobalSavePlan, ReplicatedTensorOnFourRanksIsWrittenOnceAndBalanced) {
  // emb and head are replicated (32 B each); w is sharded by rows (8 B per rank).
  std::vector<FlatStateDict> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(flat_of({{"emb", whole({8})}, {"head", whole({8})}, {"w", shard({4, 2}, {r, 0}, {1, 2})}}));
  }
  GlobalSavePlan global = make_global_save_plan(local_plans(ranks));
  ASSERT_EQ(global.plans.size(), 4u);
  // Walk: emb -> rank 0 (all empty); head -> rank 1 (smallest, 0 B); w@0 -> rank 0 only;
  // w@1..3 -> their only holders.
  EXPECT_EQ(item_names(global.plans[0]), (std::vector<std::string>{"emb@0", "w@0"}));
  EXPECT_EQ(item_names(global.plans[1]), (std::vector<std::string>{"head@0", "w@1"}));
  EXPECT_EQ(item_names(global.plans[2]), (std::vector<std::string>{"w@2"}));
  EXPECT_EQ(item_names(global.plans[3]), (std::vector<std::string>{"w@3"}));

  const auto& emb = std::get<format::TensorStorageMetadata>(global.metadata.state_dict_metadata.at("emb"));
  EXPECT_EQ(emb.chunks, (std::vector<format::ChunkStorageMetadata>{{{0}, {8}}}));
  const auto& w = std::get<format::TensorStorageMetadata>(global.metadata.state_dict_metadata.at("w"));
  EXPECT_EQ(w.size, (Shape{4, 2}));
  EXPECT_EQ(w.chunks, (std::vector<format::ChunkStorageMetadata>{
                          {{0, 0}, {1, 2}}, {{1, 0}, {1, 2}}, {{2, 0}, {1, 2}}, {{3, 0}, {1, 2}}}));
  // Each item's MetadataIndex.index is its chunk's position.
  EXPECT_EQ(global.plans[2].items[0].index.index, 2);
  EXPECT_EQ(global.plans[1].items[0].index.index, 0);
  EXPECT_TRUE(global.metadata.storage_data.empty());
}

TEST(GlobalSavePlan, ManyReplicatedTensorsSpreadOverRanks) {
  std::vector<FlatStateDict> ranks(4, flat_of({{"a", whole({4})},
                                               {"b", whole({4})},
                                               {"c", whole({4})},
                                               {"d", whole({4})},
                                               {"step", pickle::Value::integer(1)}}));
  GlobalSavePlan global = make_global_save_plan(local_plans(ranks));
  EXPECT_EQ(item_names(global.plans[0]), (std::vector<std::string>{"step", "a@0"}));  // bytes first in the file
  EXPECT_EQ(item_names(global.plans[1]), (std::vector<std::string>{"b@0"}));
  EXPECT_EQ(item_names(global.plans[2]), (std::vector<std::string>{"c@0"}));
  EXPECT_EQ(item_names(global.plans[3]), (std::vector<std::string>{"d@0"}));
  EXPECT_TRUE(std::holds_alternative<format::BytesStorageMetadata>(global.metadata.state_dict_metadata.at("step")));

  SavePlanOptions lowest;
  lowest.dedup_to_lowest_rank = true;
  GlobalSavePlan to_zero = make_global_save_plan(local_plans(ranks), lowest);
  EXPECT_EQ(item_names(to_zero.plans[0]), (std::vector<std::string>{"step", "a@0", "b@0", "c@0", "d@0"}));
  for (int r = 1; r < 4; ++r) {
    EXPECT_TRUE(to_zero.plans[r].items.empty());
    EXPECT_EQ(to_zero.plans[r].files, (std::vector<std::string>{"__" + std::to_string(r) + "_0.distcp"}));
  }
}

TEST(SplitIntoFiles, SmallItemsInTheFirstFileOtherTensorsLargestFirst) {
  using T = WriteItemType;
  // bytes, 100 KiB, bytes, 1 KiB, 300 KiB, 200 KiB
  const std::vector<ItemWeight> items = {{T::kBytes, 0},        {T::kTensor, 100 << 10}, {T::kBytes, 0},
                                         {T::kTensor, 1 << 10}, {T::kTensor, 300 << 10}, {T::kTensor, 200 << 10}};
  SavePlanOptions options;
  options.thread_count = 2;
  // Bytes items and the 1 KiB tensor to file 0 (1 KiB counted), then 300 KiB -> file 1,
  // 200 KiB and 100 KiB -> file 0; in a file bytes, small tensors, the rest.
  EXPECT_EQ(split_into_files(items, options), (std::vector<std::vector<std::size_t>>{{0, 2, 3, 5, 1}, {4}}));
  options.thread_count = 1;  // plan order, bytes first, then the small tensors
  EXPECT_EQ(split_into_files(items, options), (std::vector<std::vector<std::size_t>>{{0, 2, 3, 1, 4, 5}}));
  options.thread_count = 3;
  options.single_file_per_rank = false;
  EXPECT_EQ(split_into_files(items, options).size(), items.size());
  options.thread_count = 0;
  EXPECT_THROW(split_into_files(items, options), UsageError);
}

TEST(GlobalSavePlan, IsDeterministic) {
  std::vector<FlatStateDict> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(flat_of({{"x", whole({5})}, {"y", shard({9}, {3 * r}, {3})}, {"z", pickle::Value::integer(r)}}));
  }
  GlobalSavePlan a = make_global_save_plan(local_plans(ranks), SavePlanOptions{.thread_count = 2});
  GlobalSavePlan b = make_global_save_plan(local_plans(ranks), SavePlanOptions{.thread_count = 2});
  EXPECT_EQ(a.plans, b.plans);
  EXPECT_EQ(a.metadata.state_dict_metadata, b.metadata.state_dict_metadata);
}

TEST(GlobalSavePlan, ZeroDimTensorIsKeptOnceWithAnEmptyOffset) {
  std::vector<FlatStateDict> ranks(2, flat_of({{"scale", whole({})}}));
  GlobalSavePlan global = make_global_save_plan(local_plans(ranks));
  ASSERT_EQ(global.plans[0].items.size(), 1u);
  EXPECT_TRUE(global.plans[1].items.empty());
  EXPECT_EQ(global.plans[0].items[0].index.offset, Shape{});
  EXPECT_EQ(global.plans[0].items[0].nbytes, 4u);
  const auto& md = std::get<format::TensorStorageMetadata>(global.metadata.state_dict_metadata.at("scale"));
  EXPECT_EQ(md.size, Shape{});
  EXPECT_EQ(md.chunks, (std::vector<format::ChunkStorageMetadata>{{{}, {}}}));
}

TEST(GlobalSavePlan, PlannerDataIsMergedFromAllRanks) {
  StateNode r0{StateDict{{"model", StateNode(StateDict{{"w", StateNode(shard({2}, {0}, {1}))}})}}};
  StateNode r1{StateDict{{"model", StateNode(StateDict{{"w", StateNode(shard({2}, {1}, {1}))}})},
                         {"extra", StateNode(StateList{StateNode(whole({1}))})}}};
  std::vector<FlatStateDict> ranks{flatten_state_dict(r0), flatten_state_dict(r1)};
  // "extra.0" only exists on rank 1: coverage still holds since rank 1 writes it whole.
  GlobalSavePlan global = make_global_save_plan(local_plans(ranks));
  EXPECT_EQ(global.metadata.planner_data,
            (std::map<std::string, ObjectPath>{{"extra.0", {"extra", std::int64_t{0}}}, {"model.w", {"model", "w"}}}));
}

TEST(GlobalSavePlanValidation, OverlappingChunks) {
  std::vector<FlatStateDict> ranks{flat_of({{"w", shard({8, 3}, {0, 0}, {5, 3})}}),
                                   flat_of({{"w", shard({8, 3}, {4, 0}, {4, 3})}})};
  EXPECT_EQ(plan_error(local_plans(ranks)), "invalid global save plan (2 problems):\n"
                                            "  \"w\": chunk [0:5, 0:3] overlaps chunk [4:8, 0:3]\n"
                                            "  \"w\": chunks hold 27 elements, the tensor's size [8, 3] has 24");
}

TEST(GlobalSavePlanValidation, OverlapAlongDimOne) {
  // Column chunks all start at row 0: the sweep runs along dim 1, and still finds the pair.
  std::vector<FlatStateDict> ranks{flat_of({{"w", shard({4, 6}, {0, 0}, {4, 2})}}),
                                   flat_of({{"w", shard({4, 6}, {0, 2}, {4, 2})}}),
                                   flat_of({{"w", shard({4, 6}, {0, 3}, {4, 3})}})};
  EXPECT_EQ(plan_error(local_plans(ranks)), "invalid global save plan (2 problems):\n"
                                            "  \"w\": chunk [0:4, 2:4] overlaps chunk [0:4, 3:6]\n"
                                            "  \"w\": chunks hold 28 elements, the tensor's size [4, 6] has 24");
}

TEST(GlobalSavePlanValidation, Gap) {
  std::vector<FlatStateDict> ranks{flat_of({{"w", shard({8, 3}, {0, 0}, {3, 3})}}),
                                   flat_of({{"w", shard({8, 3}, {4, 0}, {4, 3})}})};
  EXPECT_EQ(plan_error(local_plans(ranks)), "invalid global save plan (1 problem):\n"
                                            "  \"w\": chunks hold 21 elements, the tensor's size [8, 3] has 24");
}

TEST(GlobalSavePlanValidation, OutOfBounds) {
  // Local plans from another source (e.g. gathered) are re-checked globally.
  std::vector<SavePlan> plans = local_plans({flat_of({{"w", shard({8}, {0}, {8})}})});
  plans[0].items[0].chunk.sizes = {9};
  EXPECT_EQ(plan_error(plans), "invalid global save plan (2 problems):\n"
                               "  \"w\": chunk [0:9] is outside the tensor's size [8]\n"
                               "  \"w\": chunks hold 0 elements, the tensor's size [8] has 8");
}

TEST(GlobalSavePlanValidation, DTypeAndShapeMismatchNameFqnAndRanks) {
  std::vector<FlatStateDict> ranks{flat_of({{"w", shard({8}, {0}, {4})}}), flat_of({{"w", shard({8}, {4}, {4})}}),
                                   flat_of({{"w", shard({8}, {4}, {4}, DType::kBFloat16)}}),
                                   flat_of({{"w", shard({9}, {0}, {4})}})};
  EXPECT_EQ(plan_error(local_plans(ranks)),
            "invalid global save plan (2 problems):\n"
            "  \"w\": dtype differs across ranks: float32 on ranks 0, 1, 3; bfloat16 on rank 2\n"
            "  \"w\": global size differs across ranks: [8] on ranks 0, 1, 2; [9] on rank 3");
}

TEST(GlobalSavePlanValidation, SameOffsetDifferentSizesAndTypeConflicts) {
  std::vector<FlatStateDict> ranks{flat_of({{"w", shard({8}, {0}, {4})}, {"n", pickle::Value::integer(1)}}),
                                   flat_of({{"w", shard({8}, {0}, {8})}, {"n", whole({1})}})};
  EXPECT_EQ(plan_error(local_plans(ranks)),
            "invalid global save plan (2 problems):\n"
            "  \"n\": type differs across ranks: bytes on rank 0; tensor on rank 1\n"
            "  \"w\": size of the chunk at offsets [0] differs across ranks: [4] on rank 0; [8] on rank 1");
}

TEST(GlobalSavePlanValidation, PlansMustBeInRankOrder) {
  std::vector<SavePlan> plans = local_plans({flat_of({}), flat_of({})});
  std::swap(plans[0], plans[1]);
  EXPECT_THROW(make_global_save_plan(plans), UsageError);
  EXPECT_THROW(make_global_save_plan({}, SavePlanOptions{.thread_count = 0}), UsageError);
}

TEST(FileAssignment, OneThreadPutsBytesFirst) {
  std::vector<FlatStateDict> ranks{flat_of({{"a", whole({2})}, {"b", pickle::Value::integer(1)}, {"c", whole({3})}})};
  GlobalSavePlan global = make_global_save_plan(local_plans(ranks));
  const SavePlan& plan = global.plans[0];
  EXPECT_EQ(plan.files, (std::vector<std::string>{"__0_0.distcp"}));
  EXPECT_EQ(item_names(plan), (std::vector<std::string>{"b", "a@0", "c@0"}));
  for (std::size_t i = 0; i < plan.items.size(); ++i) {
    EXPECT_EQ(plan.items[i].file, "__0_0.distcp");
    EXPECT_EQ(plan.items[i].index_in_file, static_cast<std::int64_t>(i));
  }
  EXPECT_EQ(plan.items[1].to_string(), "tensor \"a\" [0:2] of float32[2] (8 B) chunk #0 -> __0_0.distcp#1");
}

TEST(SplitIntoFiles, SmallTensorsBeyondFourMiBAreSpreadOverTheFiles) {
  // 100 tensors of 60 KiB (small), as a state of small shards on many ranks: the first file
  // takes 4 MiB of them, the others are spread, and every file is written.
  const std::vector<ItemWeight> items(100, ItemWeight{WriteItemType::kTensor, 60 << 10});
  SavePlanOptions options;
  options.thread_count = 4;
  const std::vector<std::vector<std::size_t>> files = split_into_files(items, options);
  ASSERT_EQ(files.size(), 4u);
  // 68 gathered (4080 KiB), the other 32 onto the lighter files 1-3.
  EXPECT_EQ(files[0].size(), 68u);
  EXPECT_EQ(files[1].size(), 11u);
  EXPECT_EQ(files[2].size(), 11u);
  EXPECT_EQ(files[3].size(), 10u);
  for (std::size_t i = 0; i < 68; ++i) EXPECT_EQ(files[0][i], i);  // plan order
}

TEST(FileAssignment, ThreeThreadsBalanceTensorBytes) {
  // Bytes b1..b4 go to the first file; tensors 100, 40, 80, 20, 60 B (none counted small
  // here) go largest first to the emptiest bucket: ta->0, tc->1, te->2, tb->2, td->1.
  FlatStateDict rank0 = flat_of({{"b1", pickle::Value::integer(1)},
                                 {"b2", pickle::Value::integer(2)},
                                 {"b3", pickle::Value::integer(3)},
                                 {"b4", pickle::Value::integer(4)},
                                 {"ta", whole({25})},
                                 {"tb", whole({10})},
                                 {"tc", whole({20})},
                                 {"td", whole({5})},
                                 {"te", whole({15})}});
  GlobalSavePlan global = make_global_save_plan(local_plans({rank0, flat_of({})}),
                                                SavePlanOptions{.thread_count = 3, .small_item_bytes = 0});
  const SavePlan& plan = global.plans[0];
  EXPECT_EQ(plan.files, (std::vector<std::string>{"__0_0.distcp", "__0_1.distcp", "__0_2.distcp"}));
  std::map<std::string, std::vector<std::string>> files;
  std::map<std::string, std::uint64_t> tensor_bytes;
  for (const WriteItem& item : plan.items) {
    EXPECT_EQ(item.index_in_file, static_cast<std::int64_t>(files[item.file].size()));
    files[item.file].push_back(item.index.fqn);
    tensor_bytes[item.file] += item.nbytes;
  }
  EXPECT_EQ(files["__0_0.distcp"], (std::vector<std::string>{"b1", "b2", "b3", "b4", "ta"}));
  EXPECT_EQ(files["__0_1.distcp"], (std::vector<std::string>{"tc", "td"}));
  EXPECT_EQ(files["__0_2.distcp"], (std::vector<std::string>{"te", "tb"}));
  EXPECT_EQ(tensor_bytes, (std::map<std::string, std::uint64_t>{
                              {"__0_0.distcp", 100}, {"__0_1.distcp", 100}, {"__0_2.distcp", 100}}));
  // A rank with nothing to write still creates its three (empty) files.
  EXPECT_TRUE(global.plans[1].items.empty());
  EXPECT_EQ(global.plans[1].files, (std::vector<std::string>{"__1_0.distcp", "__1_1.distcp", "__1_2.distcp"}));
}

TEST(FileAssignment, OneFilePerItem) {
  std::vector<FlatStateDict> ranks{flat_of({{"a", whole({2})}, {"b", pickle::Value::integer(1)}})};
  GlobalSavePlan global = make_global_save_plan(local_plans(ranks), SavePlanOptions{.single_file_per_rank = false});
  const SavePlan& plan = global.plans[0];
  EXPECT_EQ(plan.files, (std::vector<std::string>{"__0_0.distcp", "__0_1.distcp"}));
  EXPECT_EQ(plan.items[0].index.fqn, "a");
  EXPECT_EQ(plan.items[0].file, "__0_0.distcp");
  EXPECT_EQ(plan.items[1].file, "__0_1.distcp");
  EXPECT_EQ(plan.items[1].index_in_file, 0);
}

TEST(FileAssignment, SmallTensorsFollowTheBytesItemsAheadOfLargeOnes) {
  // Two ranks of two layers: a 0-dim step on both, a bias and a weight sharded by rows
  // (8 B and 128 KiB per rank), and an object. In fqn order the steps and biases sit
  // between the weights; written, they are one run after the object.
  auto rank = [](std::int64_t r) {
    return flat_of({{"l0.b", shard({4}, {2 * r}, {2})},
                    {"l0.step", whole({})},
                    {"l0.w", shard({65536}, {32768 * r}, {32768})},
                    {"l1.b", shard({4}, {2 * r}, {2})},
                    {"l1.step", whole({})},
                    {"l1.w", shard({65536}, {32768 * r}, {32768})},
                    {"opt", pickle::Value::integer(1)}});
  };
  const std::vector<SavePlan> plans = local_plans({rank(0), rank(1)});
  SavePlanOptions options{.dedup_to_lowest_rank = true};
  GlobalSavePlan global = make_global_save_plan(plans, options);
  EXPECT_EQ(item_names(global.plans[0]),
            (std::vector<std::string>{"opt", "l0.b@0", "l0.step", "l1.b@0", "l1.step", "l0.w@0", "l1.w@0"}));
  EXPECT_EQ(item_names(global.plans[1]), (std::vector<std::string>{"l0.b@2", "l1.b@2", "l0.w@32768", "l1.w@32768"}));
  for (const SavePlan& plan : global.plans) {
    for (std::size_t i = 0; i < plan.items.size(); ++i) {
      EXPECT_EQ(plan.items[i].index_in_file, static_cast<std::int64_t>(i)) << plan.items[i].to_string();
    }
  }
  // The limit is exclusive: at 128 KiB the weights are still large; one byte more and every
  // tensor is small, so the tensors keep plan order.
  options.small_item_bytes = 128 << 10;
  EXPECT_EQ(item_names(make_global_save_plan(plans, options).plans[0]),
            (std::vector<std::string>{"opt", "l0.b@0", "l0.step", "l1.b@0", "l1.step", "l0.w@0", "l1.w@0"}));
  options.small_item_bytes = (128 << 10) + 1;
  EXPECT_EQ(item_names(make_global_save_plan(plans, options).plans[0]),
            (std::vector<std::string>{"opt", "l0.b@0", "l0.step", "l0.w@0", "l1.b@0", "l1.step", "l1.w@0"}));
  // 0: plan order, bytes items still first (DCP's writer).
  options.small_item_bytes = 0;
  EXPECT_EQ(item_names(make_global_save_plan(plans, options).plans[0]),
            (std::vector<std::string>{"opt", "l0.b@0", "l0.step", "l0.w@0", "l1.b@0", "l1.step", "l1.w@0"}));
}

TEST(GlobalSavePlan, DTensorBoxesOnATwoDimensionalMesh) {
  // Mesh 2x2: Shard(0) x Shard(1) of a [5, 6] tensor; ceil division gives rows 3 + 2.
  auto boxes = shard_boxes({5, 6}, {2, 2}, {Placement::shard(0), Placement::shard(1)});
  std::vector<FlatStateDict> ranks;
  for (const auto& [offsets, sizes] : boxes) ranks.push_back(flat_of({{"w", shard({5, 6}, offsets, sizes)}}));
  GlobalSavePlan global = make_global_save_plan(local_plans(ranks));
  const auto& w = std::get<format::TensorStorageMetadata>(global.metadata.state_dict_metadata.at("w"));
  EXPECT_EQ(w.chunks, (std::vector<format::ChunkStorageMetadata>{
                          {{0, 0}, {3, 3}}, {{0, 3}, {3, 3}}, {{3, 0}, {2, 3}}, {{3, 3}, {2, 3}}}));
}

TEST(StorageLayout, ConcatenatesEachFilesBlobsInWriteOrder) {
  FlatStateDict rank0 =
      flat_of({{"b1", pickle::Value::integer(1)}, {"ta", whole({25})}, {"tb", whole({10})}, {"tc", whole({20})}});
  GlobalSavePlan global =
      make_global_save_plan(local_plans({rank0}), SavePlanOptions{.thread_count = 2, .small_item_bytes = 0});
  const SavePlan& plan = global.plans[0];
  // __0_0: b1, ta; __0_1: tc, tb.
  ASSERT_EQ(item_names(plan), (std::vector<std::string>{"b1", "ta@0", "tc@0", "tb@0"}));
  std::vector<std::uint64_t> lengths{300, 1000, 900, 700};
  auto layout = storage_layout(plan, lengths);
  using format::MetadataIndex;
  using format::StorageInfo;
  EXPECT_EQ(layout, (std::map<MetadataIndex, StorageInfo>{
                        {MetadataIndex{"b1", std::nullopt, std::nullopt}, StorageInfo{"__0_0.distcp", 0, 300, {}}},
                        {MetadataIndex{"ta", Shape{0}, 0}, StorageInfo{"__0_0.distcp", 300, 1000, {}}},
                        {MetadataIndex{"tc", Shape{0}, 0}, StorageInfo{"__0_1.distcp", 0, 900, {}}},
                        {MetadataIndex{"tb", Shape{0}, 0}, StorageInfo{"__0_1.distcp", 900, 700, {}}}}));
  EXPECT_EQ(layout.at(MetadataIndex{"tb", Shape{0}, std::nullopt}).offset, 900u);
  EXPECT_THROW(storage_layout(plan, std::vector<std::uint64_t>{1, 2}), UsageError);
  EXPECT_THROW(storage_layout(make_local_save_plan(rank0, 0), std::vector<std::uint64_t>{1, 2, 3, 4}), UsageError);
}

TEST(FilesPerRank, RaisedToFourOnlyOnObjectStores) {
  storage::StorageFeatures files;  // local files, memory
  storage::StorageFeatures objects;
  objects.object_store = true;  // s3://, az://, gs://
  EXPECT_EQ(files_per_rank(1, files), 1);
  EXPECT_EQ(files_per_rank(3, files), 3);
  EXPECT_EQ(files_per_rank(1, objects), kObjectStoreFilesPerRank);
  EXPECT_EQ(files_per_rank(3, objects), 4);
  EXPECT_EQ(files_per_rank(8, objects), 8);
}

}  // namespace
}  // namespace shardpoint::engine
