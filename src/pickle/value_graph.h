// Graph view of a value tree: uniform child access and a one-pass analysis (nesting depth,
// nodes on cycles). Internal to src/pickle: the reader uses it to enforce max_depth and to
// decide who owns a cyclic graph.
//
// Thread-safety: pure functions over a tree nobody mutates meanwhile.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <unordered_set>
#include <vector>

#include "shardpoint/pickle_value.h"

namespace shardpoint::pickle {

// Children in a fixed order: items, then entries (key, value, key, ...), then for kObject
// callable, args, kwargs, state, and for kPersistentId the pid. Null slots are skipped by
// child_at() returning nullptr; callers skip them.
std::size_t child_count(const Value& v);
const ValuePtr& child_at(const Value& v, std::size_t i);

struct GraphShape {
  // Longest chain of nested nodes from the root, counting the root as 1. Nodes on a cycle
  // count as the whole strongly connected component they belong to, so this bounds the
  // recursion of any walker that stops at nodes it is already inside (writer, repr,
  // deep_equal), whatever order it visits children in.
  std::size_t depth = 0;
  // Every node that lies on a cycle (strongly connected component of more than one node,
  // or a node that contains itself). Empty for an acyclic graph.
  std::vector<ValuePtr> cyclic_nodes;
  // How many nodes are reachable from the root (the root included).
  std::size_t reachable = 0;
  // The nodes of `watched` (see analyze_graph) that are not reachable from the root.
  std::vector<ValuePtr> unreachable_watched;
};

// Walks the graph from root without recursion, in time and memory linear in its size.
// `watched`: nodes to report in unreachable_watched when the root does not reach them
// (the reader passes every container it built); its size also presizes the walk.
GraphShape analyze_graph(const ValuePtr& root, std::span<const ValuePtr> watched = {});

// GraphShape::depth of a graph the caller knows to be acyclic, in which only the nodes of
// `shared` may have more than one parent (their heights are remembered; every other node
// is visited once). Much cheaper than analyze_graph: no map over all nodes. Returns
// nullopt as soon as a path holds more than `max_path` nodes, which a graph of at most
// that many nodes can only do through a cycle.
std::optional<std::size_t> acyclic_depth(const ValuePtr& root, const std::unordered_set<const Value*>& shared,
                                         std::size_t max_path);

}  // namespace shardpoint::pickle
