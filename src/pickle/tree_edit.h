// Edits of an unpickled value graph in place: swapping chosen nodes for others, and asking
// whether a subtree references persistent ids (tensor storages). The engine uses them to
// turn checkpoint trees into what it writes (placeholders for tensors, then tensor nodes).
//
// Thread-safety: the graph must not be read or written by another thread meanwhile.
#pragma once

#include <functional>

#include "shardpoint/pickle_value.h"

namespace shardpoint::pickle {

// Walks the graph from `root` (depth first, in the order the pickle writer meets the nodes:
// items; dict keys and values; for an object, the children of its callable, args and
// kwargs containers, its appended items and set entries, then the children of its state)
// and calls replacement(node) on every slot's node, root included. A non-null result
// replaces the node in that slot, and in every other slot holding the same node (the
// function is called once per node); null means "keep it and look inside" (each node is
// entered once, so shared and cyclic graphs terminate). Replacements are not entered.
// Exceptions from `replacement` propagate; slots already replaced stay replaced.
void replace_nodes(ValuePtr& root, const std::function<ValuePtr(const ValuePtr&)>& replacement);

// True when v or any node under it is a persistent id.
bool holds_persistent_id(const Value& v);

}  // namespace shardpoint::pickle
