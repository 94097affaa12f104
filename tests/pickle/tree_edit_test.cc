// replace_nodes / holds_persistent_id: shared nodes replaced once, cycles terminate,
// replacements are not entered.
#include "pickle/tree_edit.h"

#include <gtest/gtest.h>

namespace shardpoint::pickle {
namespace {

bool is_str(const ValuePtr& v, const char* s) { return v && v->is(Kind::kStr) && v->as_string() == s; }

TEST(TreeEditTest, ReplacesSharedNodesOnceAndEverywhere) {
  ValuePtr shared = Value::str("x");
  ValuePtr root = Value::dict({{Value::str("a"), shared}, {Value::str("b"), Value::list({shared, Value::str("y")})}});
  int calls_for_x = 0;
  replace_nodes(root, [&](const ValuePtr& node) -> ValuePtr {
    if (!is_str(node, "x")) return nullptr;
    ++calls_for_x;
    return Value::str("X");
  });
  EXPECT_EQ(calls_for_x, 1);
  EXPECT_TRUE(is_str(root->entries()[0].second, "X"));
  EXPECT_EQ(root->entries()[0].second, root->entries()[1].second->items()[0]);  // still one node
  EXPECT_TRUE(is_str(root->entries()[1].second->items()[1], "y"));
}

TEST(TreeEditTest, CyclesTerminateAndTheRootCanBeReplaced) {
  ValuePtr list = Value::list();
  list->mutable_items().push_back(list);  // contains itself
  list->mutable_items().push_back(Value::str("x"));
  int visits = 0;
  replace_nodes(list, [&](const ValuePtr& node) -> ValuePtr {
    ++visits;
    return is_str(node, "x") ? Value::str("X") : nullptr;
  });
  EXPECT_EQ(visits, 2);  // the list once, "x" once
  EXPECT_TRUE(is_str(list->items()[1], "X"));
  list->mutable_items().clear();  // break the cycle

  ValuePtr root = Value::str("x");
  replace_nodes(root, [](const ValuePtr& node) -> ValuePtr {
    // A replacement is not entered: returning a node holding "x" does not recurse.
    return is_str(node, "x") ? Value::list({Value::str("x")}) : nullptr;
  });
  ASSERT_TRUE(root->is(Kind::kList));
  EXPECT_TRUE(is_str(root->items()[0], "x"));
}

TEST(TreeEditTest, HoldsPersistentId) {
  EXPECT_FALSE(holds_persistent_id(*Value::dict({{Value::str("a"), Value::list({Value::integer(1)})}})));
  EXPECT_TRUE(holds_persistent_id(*Value::list({Value::tuple({Value::persistent_id(Value::str("storage"))})})));
}

}  // namespace
}  // namespace shardpoint::pickle
