#include "pickle/value_graph.h"

#include <algorithm>
#include <unordered_map>

namespace shardpoint::pickle {

namespace {

const ValuePtr kNoChild;

// The kObject / kPersistentId slots after items and entries.
std::size_t extra_slots(const Value& v) {
  if (v.is(Kind::kObject)) return 4;
  if (v.is(Kind::kPersistentId)) return 1;
  return 0;
}

}  // namespace

std::size_t child_count(const Value& v) { return v.items().size() + 2 * v.entries().size() + extra_slots(v); }

const ValuePtr& child_at(const Value& v, std::size_t i) {
  const auto& items = v.items();
  if (i < items.size()) return items[i];
  i -= items.size();
  const auto& entries = v.entries();
  if (i < 2 * entries.size()) return i % 2 == 0 ? entries[i / 2].first : entries[i / 2].second;
  i -= 2 * entries.size();
  if (v.is(Kind::kPersistentId)) return i == 0 ? v.pid() : kNoChild;
  if (v.is(Kind::kObject)) {
    switch (i) {
      case 0: return v.callable();
      case 1: return v.args();
      case 2: return v.kwargs();
      case 3: return v.state();
      default: break;
    }
  }
  return kNoChild;
}

namespace {

// Iterative Tarjan strongly-connected-components walk. A component is finished only after
// every component it reaches, so its height (its size plus the tallest component it
// points to) is known when it is popped.
class GraphWalk {
 public:
  GraphShape run(const ValuePtr& root, std::span<const ValuePtr> watched) {
    GraphShape shape;
    if (root) {
      ids_.reserve(2 * watched.size() + 16);  // containers plus, typically, as many leaves
      enter(root);
      while (!frames_.empty()) step();
      shape.depth = component_height_[component_[0]];
      shape.cyclic_nodes = std::move(cyclic_);
      shape.reachable = nodes_.size();
    }
    for (const ValuePtr& node : watched) {
      if (!ids_.contains(node.get())) shape.unreachable_watched.push_back(node);
    }
    return shape;
  }

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  struct Frame {
    std::size_t id;
    std::size_t next_child = 0;
  };

  void enter(const ValuePtr& node) {
    std::size_t id = nodes_.size();
    ids_.emplace(node.get(), id);
    nodes_.push_back(&node);
    index_low_.push_back({id, id});
    on_stack_.push_back(true);
    self_loop_.push_back(false);
    tallest_successor_.push_back(0);
    component_.push_back(kNone);
    scc_stack_.push_back(id);
    frames_.push_back({id});
  }

  void step() {
    Frame& frame = frames_.back();
    const Value& v = **nodes_[frame.id];
    if (frame.next_child < child_count(v)) {
      const ValuePtr& child = child_at(v, frame.next_child++);
      if (child) visit_edge(frame.id, child);
      return;
    }
    std::size_t id = frame.id;
    frames_.pop_back();
    if (index_low_[id].second == index_low_[id].first) pop_component(id);
    if (!frames_.empty()) absorb_child(frames_.back().id, id);
  }

  void visit_edge(std::size_t from, const ValuePtr& child) {
    auto it = ids_.find(child.get());
    if (it == ids_.end()) {
      enter(child);  // absorbed into `from` when its frame finishes
      return;
    }
    std::size_t to = it->second;
    if (to == from) self_loop_[from] = true;
    absorb_child(from, to);
  }

  // Folds a visited child into its parent: same component (on the stack) lowers the
  // parent's link; a finished component raises the parent's tallest successor.
  void absorb_child(std::size_t parent, std::size_t child) {
    if (on_stack_[child]) {
      index_low_[parent].second = std::min(index_low_[parent].second, index_low_[child].second);
    } else {
      tallest_successor_[parent] = std::max(tallest_successor_[parent], component_height_[component_[child]]);
    }
  }

  void pop_component(std::size_t root_id) {
    std::size_t component = component_height_.size();
    std::size_t size = 0, tallest = 0;
    std::size_t first = scc_stack_.size();
    do {
      --first;
    } while (scc_stack_[first] != root_id);
    for (std::size_t i = first; i < scc_stack_.size(); ++i) {
      std::size_t member = scc_stack_[i];
      on_stack_[member] = false;
      component_[member] = component;
      tallest = std::max(tallest, tallest_successor_[member]);
      ++size;
    }
    if (size > 1 || self_loop_[root_id]) {
      for (std::size_t i = first; i < scc_stack_.size(); ++i) cyclic_.push_back(*nodes_[scc_stack_[i]]);
    }
    scc_stack_.resize(first);
    component_height_.push_back(size + tallest);
  }

  std::unordered_map<const Value*, std::size_t> ids_;
  std::vector<const ValuePtr*> nodes_;
  std::vector<std::pair<std::size_t, std::size_t>> index_low_;
  std::vector<bool> on_stack_;
  std::vector<bool> self_loop_;
  std::vector<std::size_t> tallest_successor_;
  std::vector<std::size_t> component_;
  std::vector<std::size_t> component_height_;
  std::vector<std::size_t> scc_stack_;
  std::vector<Frame> frames_;
  std::vector<ValuePtr> cyclic_;
};

}  // namespace

GraphShape analyze_graph(const ValuePtr& root, std::span<const ValuePtr> watched) {
  return GraphWalk().run(root, watched);
}

std::optional<std::size_t> acyclic_depth(const ValuePtr& root, const std::unordered_set<const Value*>& shared,
                                         std::size_t max_path) {
  if (!root) return 0;
  struct Frame {
    const Value* node;
    std::size_t next_child = 0;
    std::size_t tallest_child = 0;
  };
  std::unordered_map<const Value*, std::size_t> shared_height;
  std::vector<Frame> path{{root.get()}};
  std::size_t finished = 0;  // height of the node that just finished
  while (!path.empty()) {
    Frame& frame = path.back();
    if (frame.next_child < child_count(*frame.node)) {
      const Value* child = child_at(*frame.node, frame.next_child++).get();
      if (child == nullptr) continue;
      if (child_count(*child) == 0) {  // most nodes: no lookup, no frame
        frame.tallest_child = std::max<std::size_t>(frame.tallest_child, 1);
        continue;
      }
      if (shared.contains(child)) {
        if (auto it = shared_height.find(child); it != shared_height.end()) {
          frame.tallest_child = std::max(frame.tallest_child, it->second);
          continue;
        }
      }
      if (path.size() >= max_path) return std::nullopt;
      path.push_back({child});
      continue;
    }
    finished = frame.tallest_child + 1;
    if (shared.contains(frame.node)) shared_height.emplace(frame.node, finished);
    path.pop_back();
    if (!path.empty()) path.back().tallest_child = std::max(path.back().tallest_child, finished);
  }
  return finished;
}

}  // namespace shardpoint::pickle
