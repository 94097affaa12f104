// replace_nodes / holds_persistent_id: shared nodes replaced once, cycles terminate,
// replacements are not entered, objects' appended items and set entries are reached in the
// pickle writer's order.
#include "pickle/tree_edit.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

// An object's own items (APPENDS) and entries (SETITEMS) are children too, met after its
// call's arguments and before its BUILD state, as the pickle writer emits them.
TEST(TreeEditTest, ObjectItemsAndEntriesInPicklerOrder) {
  ValuePtr object = Value::call("collections", "OrderedDict", {Value::str("arg")});
  object->mutable_items().push_back(Value::str("item"));
  object->mutable_entries().emplace_back(Value::str("key"), Value::persistent_id(Value::str("pid")));
  object->set_state(Value::dict({{Value::str("state"), Value::str("value")}}));
  EXPECT_TRUE(holds_persistent_id(*object));

  std::vector<std::string> met;
  ValuePtr root = object;
  replace_nodes(root, [&](const ValuePtr& node) -> ValuePtr {
    if (node->is(Kind::kStr)) met.push_back(node->as_string());
    if (node->is(Kind::kPersistentId)) return Value::str("replaced");
    return nullptr;
  });
  EXPECT_EQ(met, (std::vector<std::string>{"arg", "item", "key", "state", "value"}));
  EXPECT_TRUE(is_str(object->entries()[0].second, "replaced"));
}

}  // namespace
}  // namespace shardpoint::pickle
