// Flattening: a nested state dict (StateNode tree) <-> a flat map fqn -> leaf, the way
// DCP's flatten_state_dict / unflatten_state_dict do it (docs/dcp-format.md §4.1).
//
// A leaf is a tensor shard or an object (pickle value). Keys are path elements joined with
// "." (list indices in decimal); `planner_data` keeps each key's path so the nesting can be
// rebuilt. Two traversal rules exist:
//   kDcp24 (PyTorch >= 2.4, the default): every mapping is descended; a list is a leaf
//     unless it contains, recursively, a tensor or a mapping; objects are leaves; empty
//     mappings disappear.
//   kDcp23 (PyTorch <= 2.3): a mapping or list is a leaf unless it contains, recursively, a
//     tensor or a non-leaf container; so an all-scalar dict (or an empty one) is one leaf.
// A leaf list or mapping becomes one object: a pickle list / dict with str keys.
// Object nodes are always leaves, even when their pickle value is a dict or list.
//
// Pure functions of values; thread-compatible. Tensor leaves alias the caller's buffers
// (TensorShard::data is a span), nothing is copied.
#pragma once

#include <map>
#include <string>
#include <variant>

#include "shardpoint/metadata.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/state_dict.h"

namespace shardpoint::engine {

using format::ObjectPath;
using format::PathElement;

enum class FlattenRule {
  kDcp24,  // traverse_state_dict (PyTorch 2.4+)
  kDcp23,  // traverse_state_dict_v_2_3 (PyTorch <= 2.3; 2.5+ retries loads with it)
};

using FlatValue = std::variant<TensorShard, pickle::ValuePtr>;

struct FlatStateDict {
  // fqn -> leaf, sorted by fqn (planning output is ordered by fqn).
  std::map<std::string, FlatValue> items;
  // fqn -> path in the nested tree (the same keys as `items`); DCP's planner_data.
  std::map<std::string, ObjectPath> planner_data;
};

// Flattens `root` (REQUIRES root.is_dict(), else UsageError).
// Throws UsageError when two paths flatten to the same key, naming the key and both paths.
FlatStateDict flatten_state_dict(const StateNode& root, FlattenRule rule = FlattenRule::kDcp24);

// The inverse: a tree with every leaf of `flat.items` placed at its planner_data path
// (fqn -> (fqn,) when planner_data has no entry, as the newest DCP does). Missing
// containers are created: a dict for a str element, a list for an int element; lists are
// padded with None objects, as DCP's set_element does. Dict keys are inserted in fqn order.
// Throws UsageError when a path is empty, has a negative index, or runs through a leaf
// or a container of the other kind (the message names the fqn and the path).
StateNode unflatten_state_dict(const FlatStateDict& flat);

// Places `value` at `path` inside `root` (REQUIRES root.is_dict()), creating containers
// as unflatten_state_dict does; replaces what is there. Used by load to put loaded objects
// back into the caller's tree. Throws UsageError as unflatten_state_dict does.
void set_at_path(StateNode& root, const ObjectPath& path, StateNode value);

// The node at `path`, or nullptr when any element is missing or of the wrong kind.
const StateNode* find_at_path(const StateNode& root, const ObjectPath& path);

// "(\"optim\", \"state\", 0, \"exp_avg\")", the way Python prints the tuple.
std::string path_to_string(const ObjectPath& path);

// Path elements joined with "." (list indices in decimal): the flattened key.
std::string path_to_fqn(const ObjectPath& path);

// A tree node as a pickle value (dict with str keys, list, or the object itself).
// REQUIRES the subtree holds no tensor (UsageError otherwise).
pickle::ValuePtr to_pickle_value(const StateNode& node);

}  // namespace shardpoint::engine
