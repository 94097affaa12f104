#include "engine/flatten.h"

#include <gtest/gtest.h>

#include "engine/engine_test_util.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

using pickle::Value;
using testing::keys_of;
using testing::obj;
using testing::obj_str;
using testing::objf;
using testing::same_tree;
using testing::whole;

// The optimizer example of docs/dcp-format.md §4.1:
// {"optim": {"param_groups": [{"lr": 0.1, "params": [0, 1]}],
//            "state": {"0": {"exp_avg": T, "step": 3}}}}
StateNode optim_example() {
  StateNode group{StateDict{{"lr", objf(0.1)}, {"params", StateNode(StateList{obj(0), obj(1)})}}};
  StateNode state0{StateDict{{"exp_avg", StateNode(whole({4}))}, {"step", obj(3)}}};
  StateNode optim{
      StateDict{{"param_groups", StateNode(StateList{group})}, {"state", StateNode(StateDict{{"0", state0}})}}};
  return StateNode(StateDict{{"optim", optim}});
}

TEST(Flatten, OptimExampleDcp24DescendsEveryMapping) {
  FlatStateDict flat = flatten_state_dict(optim_example());
  EXPECT_EQ(keys_of(flat), (std::vector<std::string>{"optim.param_groups.0.lr", "optim.param_groups.0.params",
                                                     "optim.state.0.exp_avg", "optim.state.0.step"}));
  EXPECT_EQ(flat.planner_data.at("optim.param_groups.0.lr"),
            (ObjectPath{"optim", "param_groups", std::int64_t{0}, "lr"}));
  EXPECT_EQ(flat.planner_data.at("optim.state.0.exp_avg"), (ObjectPath{"optim", "state", "0", "exp_avg"}));
  // A list of scalars is one object.
  const auto& params = std::get<pickle::ValuePtr>(flat.items.at("optim.param_groups.0.params"));
  EXPECT_TRUE(pickle::deep_equal(*params, *Value::list({Value::integer(0), Value::integer(1)})));
  EXPECT_EQ(std::get<pickle::ValuePtr>(flat.items.at("optim.param_groups.0.lr"))->as_float(), 0.1);
  EXPECT_EQ(std::get<TensorShard>(flat.items.at("optim.state.0.exp_avg")).global_shape, (Shape{4}));
}

TEST(Flatten, OptimExampleDcp23KeepsScalarContainersWhole) {
  FlatStateDict flat = flatten_state_dict(optim_example(), FlattenRule::kDcp23);
  EXPECT_EQ(keys_of(flat),
            (std::vector<std::string>{"optim.param_groups", "optim.state.0.exp_avg", "optim.state.0.step"}));
  EXPECT_EQ(flat.planner_data.at("optim.param_groups"), (ObjectPath{"optim", "param_groups"}));
  auto expected =
      Value::list({Value::dict({{Value::str("lr"), Value::floating(0.1)},
                                {Value::str("params"), Value::list({Value::integer(0), Value::integer(1)})}})});
  EXPECT_TRUE(pickle::deep_equal(*std::get<pickle::ValuePtr>(flat.items.at("optim.param_groups")), *expected));
}

TEST(Flatten, ListsOfTensorsAreDescendedWithDecimalIndices) {
  StateList layers;
  for (int i = 0; i < 12; ++i) layers.emplace_back(whole({2, 2}));
  StateNode root{StateDict{{"layers", StateNode(std::move(layers))},
                           {"mixed", StateNode(StateList{StateNode(StateList{StateNode(whole({1}))}),
                                                         StateNode(StateList{obj(1), obj(2)})})}}};
  for (FlattenRule rule : {FlattenRule::kDcp24, FlattenRule::kDcp23}) {
    FlatStateDict flat = flatten_state_dict(root, rule);
    EXPECT_EQ(flat.items.size(), 14u);
    EXPECT_TRUE(flat.items.contains("layers.0"));
    EXPECT_TRUE(flat.items.contains("layers.11"));
    EXPECT_EQ(flat.planner_data.at("layers.11"), (ObjectPath{"layers", std::int64_t{11}}));
    // [[T], [1, 2]]: the inner list holding a tensor is descended, the scalar list is a leaf.
    EXPECT_TRUE(std::holds_alternative<TensorShard>(flat.items.at("mixed.0.0")));
    EXPECT_TRUE(std::holds_alternative<pickle::ValuePtr>(flat.items.at("mixed.1")));
    EXPECT_EQ(flat.planner_data.at("mixed.0.0"), (ObjectPath{"mixed", std::int64_t{0}, std::int64_t{0}}));
  }
}

TEST(Flatten, ListOfDictsIsDescendedOnlyByDcp24) {
  StateNode root{StateDict{{"cfg", StateNode(StateList{StateNode(StateDict{{"a", obj(1)}})})}}};
  EXPECT_EQ(keys_of(flatten_state_dict(root)), (std::vector<std::string>{"cfg.0.a"}));
  EXPECT_EQ(keys_of(flatten_state_dict(root, FlattenRule::kDcp23)), (std::vector<std::string>{"cfg"}));
}

TEST(Flatten, EmptyDictsDisappearInDcp24AndAreLeavesInDcp23) {
  StateNode root{StateDict{{"a", StateNode(StateDict{})},
                           {"b", StateNode(StateDict{{"c", StateNode(StateDict{})}})},
                           {"d", obj(1)},
                           {"e", StateNode(StateList{})}}};
  FlatStateDict v24 = flatten_state_dict(root);
  EXPECT_EQ(keys_of(v24), (std::vector<std::string>{"d", "e"}));
  EXPECT_TRUE(pickle::deep_equal(*std::get<pickle::ValuePtr>(v24.items.at("e")), *Value::list()));

  FlatStateDict v23 = flatten_state_dict(root, FlattenRule::kDcp23);
  EXPECT_EQ(keys_of(v23), (std::vector<std::string>{"a", "b", "d", "e"}));
  auto b = Value::dict({{Value::str("c"), Value::dict()}});
  EXPECT_TRUE(pickle::deep_equal(*std::get<pickle::ValuePtr>(v23.items.at("b")), *b));
}

TEST(Flatten, ObjectsAreLeavesEvenWhenTheyHoldDicts) {
  StateNode root{StateDict{{"rng", StateNode(Value::dict({{Value::str("seed"), Value::integer(7)}}))}}};
  EXPECT_EQ(keys_of(flatten_state_dict(root)), (std::vector<std::string>{"rng"}));
}

TEST(Flatten, DuplicateKeysNameBothPaths) {
  StateNode root{StateDict{{"a.b", obj(1)}, {"a", StateNode(StateDict{{"b", StateNode(whole({2}))}})}}};
  try {
    flatten_state_dict(root);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "duplicate flattened key \"a.b\": paths (\"a.b\",) and (\"a\", \"b\")");
  }
  StateNode by_index{StateDict{{"x.0", obj(1)}, {"x", StateNode(StateList{StateNode(whole({1}))})}}};
  EXPECT_THROW(flatten_state_dict(by_index), UsageError);
}

TEST(Flatten, RootMustBeADict) { EXPECT_THROW(flatten_state_dict(StateNode(StateList{})), UsageError); }

TEST(Unflatten, RoundTripsTheOptimExample) {
  StateNode root = optim_example();
  for (FlattenRule rule : {FlattenRule::kDcp24, FlattenRule::kDcp23}) {
    StateNode rebuilt = unflatten_state_dict(flatten_state_dict(root, rule));
    // Leaf lists come back as objects holding the list, so compare through flattening.
    EXPECT_EQ(keys_of(flatten_state_dict(rebuilt, rule)), keys_of(flatten_state_dict(root, rule)));
    const StateNode* exp_avg = find_at_path(rebuilt, {"optim", "state", "0", "exp_avg"});
    ASSERT_NE(exp_avg, nullptr);
    EXPECT_TRUE(same_tree(*exp_avg, *find_at_path(root, {"optim", "state", "0", "exp_avg"})));
  }
  StateNode rebuilt = unflatten_state_dict(flatten_state_dict(root));
  const StateNode* groups = find_at_path(rebuilt, {"optim", "param_groups"});
  ASSERT_NE(groups, nullptr);
  ASSERT_TRUE(groups->is_list());
  EXPECT_EQ(groups->list().size(), 1u);
  EXPECT_EQ(find_at_path(rebuilt, {"optim", "param_groups", std::int64_t{0}, "lr"})->object()->as_float(), 0.1);
}

TEST(Unflatten, PadsListsWithNoneAndDefaultsToTheFlatKey) {
  FlatStateDict flat;
  flat.items.emplace("a.2", Value::integer(5));
  flat.planner_data.emplace("a.2", ObjectPath{"a", std::int64_t{2}});
  flat.items.emplace("b.1.x", Value::integer(6));
  flat.planner_data.emplace("b.1.x", ObjectPath{"b", std::int64_t{1}, "x"});
  flat.items.emplace("plain.key", Value::integer(7));  // no planner_data: stays flat
  StateNode root = unflatten_state_dict(flat);

  const StateNode* a = root.find("a");
  ASSERT_TRUE(a != nullptr && a->is_list());
  ASSERT_EQ(a->list().size(), 3u);
  EXPECT_TRUE(a->list()[0].object()->is_none());
  EXPECT_TRUE(a->list()[1].object()->is_none());
  EXPECT_EQ(a->list()[2].object()->as_int(), 5);
  const StateNode* b = root.find("b");
  ASSERT_TRUE(b != nullptr && b->is_list());
  ASSERT_EQ(b->list().size(), 2u);
  EXPECT_TRUE(b->list()[0].object()->is_none());
  EXPECT_EQ(find_at_path(root, {"b", std::int64_t{1}, "x"})->object()->as_int(), 6);
  EXPECT_EQ(root.find("plain.key")->object()->as_int(), 7);
}

TEST(Unflatten, FillsPaddingThatALaterPathRunsThrough) {
  StateNode root{StateDict{}};
  set_at_path(root, {"l", std::int64_t{1}}, obj(1));
  set_at_path(root, {"l", std::int64_t{0}, "k"}, obj(2));
  EXPECT_EQ(find_at_path(root, {"l", std::int64_t{0}, "k"})->object()->as_int(), 2);
  EXPECT_EQ(find_at_path(root, {"l", std::int64_t{1}})->object()->as_int(), 1);
}

TEST(Unflatten, ConflictingPathsAreUsageErrors) {
  FlatStateDict flat;
  flat.items.emplace("a", Value::integer(1));
  flat.planner_data.emplace("a", ObjectPath{"a"});
  flat.items.emplace("a.b", Value::integer(2));
  flat.planner_data.emplace("a.b", ObjectPath{"a", "b"});
  try {
    unflatten_state_dict(flat);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "cannot place \"a.b\" at path (\"a\", \"b\"): (\"a\",) is an object, not a container");
  }
  StateNode root{StateDict{}};
  set_at_path(root, {"x"}, StateNode(StateDict{}));
  EXPECT_THROW(set_at_path(root, {"x", std::int64_t{0}}, obj(1)), UsageError);
  EXPECT_THROW(set_at_path(root, {}, obj(1)), UsageError);
  EXPECT_THROW(set_at_path(root, {"y", std::int64_t{-1}}, obj(1)), UsageError);
}

TEST(Flatten, PathPrinting) {
  EXPECT_EQ(path_to_string({"optim", "state", std::int64_t{0}, "exp_avg"}), "(\"optim\", \"state\", 0, \"exp_avg\")");
  EXPECT_EQ(path_to_string({"w"}), "(\"w\",)");
  EXPECT_EQ(path_to_fqn({"optim", "state", std::int64_t{0}, "exp_avg"}), "optim.state.0.exp_avg");
}

}  // namespace
}  // namespace shardpoint::engine
