#include "engine/flatten.h"

#include <utility>

#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

// Whether a list (kDcp24) or a list/mapping (kDcp23) is stored whole as one object.
bool is_leaf(const StateNode& node, FlattenRule rule) {
  if (node.is_tensor() || node.is_object()) return true;
  if (node.is_dict() && rule == FlattenRule::kDcp24) return false;
  auto blocks_leaf = [rule](const StateNode& child) {
    if (child.is_tensor()) return true;
    return (child.is_dict() || child.is_list()) && !is_leaf(child, rule);
  };
  if (node.is_list()) {
    for (const StateNode& child : node.list()) {
      if (blocks_leaf(child)) return false;
    }
  } else {
    for (const auto& [key, child] : node.dict()) {
      if (blocks_leaf(child)) return false;
    }
  }
  return true;
}

class Flattener {
 public:
  explicit Flattener(FlattenRule rule) : rule_(rule) {}

  void visit(ObjectPath& path, const StateNode& node) {
    if (is_leaf(node, rule_)) {
      add_leaf(path, node);
    } else if (node.is_dict()) {
      for (const auto& [key, child] : node.dict()) {
        path.emplace_back(key);
        visit(path, child);
        path.pop_back();
      }
    } else {
      const StateList& list = node.list();
      for (std::size_t i = 0; i < list.size(); ++i) {
        path.emplace_back(static_cast<std::int64_t>(i));
        visit(path, list[i]);
        path.pop_back();
      }
    }
  }

  FlatStateDict take() { return std::move(flat_); }

 private:
  void add_leaf(const ObjectPath& path, const StateNode& node) {
    std::string fqn = path_to_fqn(path);
    auto [it, inserted] = flat_.planner_data.emplace(fqn, path);
    if (!inserted) {
      throw UsageError("duplicate flattened key \"" + fqn + "\": paths " + path_to_string(it->second) + " and " +
                       path_to_string(path));
    }
    if (node.is_tensor()) {
      flat_.items.emplace(std::move(fqn), node.tensor());
    } else {
      flat_.items.emplace(std::move(fqn), to_pickle_value(node));
    }
  }

  FlattenRule rule_;
  FlatStateDict flat_;
};

std::string describe_node(const StateNode& node) {
  if (node.is_dict()) return "a dict";
  if (node.is_list()) return "a list";
  if (node.is_tensor()) return "a tensor";
  return "an object";
}

[[noreturn]] void throw_bad_path(const ObjectPath& path, std::size_t depth, const std::string& why) {
  ObjectPath prefix(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(depth));
  throw UsageError("cannot place \"" + path_to_fqn(path) + "\" at path " + path_to_string(path) + ": " +
                   (prefix.empty() ? std::string("root") : path_to_string(prefix)) + " " + why);
}

// The child of `container` named by `element`, created (or padded) when missing.
// `depth` is the position of `element` in `path`, for messages.
StateNode& child_slot(StateNode& container, const ObjectPath& path, std::size_t depth, const StateNode& fill) {
  const PathElement& element = path[depth];
  if (const auto* key = std::get_if<std::string>(&element)) {
    if (!container.is_dict()) throw_bad_path(path, depth, "is " + describe_node(container) + ", not a dict");
    if (StateNode* existing = container.find(*key)) return *existing;
    return container.set(*key, fill);
  }
  std::int64_t index = std::get<std::int64_t>(element);
  if (!container.is_list()) throw_bad_path(path, depth, "is " + describe_node(container) + ", not a list");
  if (index < 0) throw_bad_path(path, depth, "is indexed with a negative index");
  StateList& list = container.list();
  auto wanted = static_cast<std::size_t>(index);
  while (list.size() <= wanted) list.emplace_back(pickle::Value::none());
  // A padding None becomes a container when a deeper path goes through it (set_element).
  StateNode& slot = list[wanted];
  if (slot.is_object() && slot.object() && slot.object()->is_none() && !fill.is_object()) slot = fill;
  return slot;
}

bool is_padding(const StateNode& node) { return node.is_object() && node.object() && node.object()->is_none(); }

}  // namespace

FlatStateDict flatten_state_dict(const StateNode& root, FlattenRule rule) {
  if (!root.is_dict()) throw UsageError("flatten_state_dict: the root must be a dict, got " + describe_node(root));
  Flattener flattener(rule);
  ObjectPath path;
  // Top-level values are visited even when the root itself would be a leaf (kDcp23).
  for (const auto& [key, child] : root.dict()) {
    path.emplace_back(key);
    flattener.visit(path, child);
    path.pop_back();
  }
  return flattener.take();
}

void set_at_path(StateNode& root, const ObjectPath& path, StateNode value) {
  if (path.empty()) throw UsageError("cannot place a value at an empty path");
  if (!root.is_dict()) throw_bad_path(path, 0, "is " + describe_node(root) + ", not a dict");
  StateNode* cur = &root;
  for (std::size_t depth = 0; depth + 1 < path.size(); ++depth) {
    // The container to create for the next step: a dict for a key, a list for an index.
    StateNode fill =
        std::holds_alternative<std::string>(path[depth + 1]) ? StateNode(StateDict{}) : StateNode(StateList{});
    cur = &child_slot(*cur, path, depth, fill);
    if (cur->is_tensor() || (cur->is_object() && !is_padding(*cur))) {
      throw_bad_path(path, depth + 1, "is " + describe_node(*cur) + ", not a container");
    }
  }
  StateNode& slot = child_slot(*cur, path, path.size() - 1, pickle::Value::none());
  slot = std::move(value);
}

StateNode unflatten_state_dict(const FlatStateDict& flat) {
  StateNode root{StateDict{}};
  for (const auto& [fqn, leaf] : flat.items) {
    auto found = flat.planner_data.find(fqn);
    ObjectPath path = found != flat.planner_data.end() ? found->second : ObjectPath{fqn};
    StateNode node = std::holds_alternative<TensorShard>(leaf) ? StateNode(std::get<TensorShard>(leaf))
                                                               : StateNode(std::get<pickle::ValuePtr>(leaf));
    set_at_path(root, path, std::move(node));
  }
  return root;
}

const StateNode* find_at_path(const StateNode& root, const ObjectPath& path) {
  const StateNode* cur = &root;
  for (const PathElement& element : path) {
    if (const auto* key = std::get_if<std::string>(&element)) {
      if (!cur->is_dict()) return nullptr;
      cur = cur->find(*key);
      if (cur == nullptr) return nullptr;
    } else {
      std::int64_t index = std::get<std::int64_t>(element);
      if (!cur->is_list() || index < 0 || static_cast<std::size_t>(index) >= cur->list().size()) return nullptr;
      cur = &cur->list()[static_cast<std::size_t>(index)];
    }
  }
  return cur;
}

std::string path_to_fqn(const ObjectPath& path) {
  std::string fqn;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (i > 0) fqn += '.';
    if (const auto* key = std::get_if<std::string>(&path[i])) {
      fqn += *key;
    } else {
      fqn += std::to_string(std::get<std::int64_t>(path[i]));
    }
  }
  return fqn;
}

std::string path_to_string(const ObjectPath& path) {
  std::string out = "(";
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (i > 0) out += ", ";
    if (const auto* key = std::get_if<std::string>(&path[i])) {
      out += '"' + *key + '"';
    } else {
      out += std::to_string(std::get<std::int64_t>(path[i]));
    }
  }
  if (path.size() == 1) out += ',';  // a 1-tuple, as Python prints it
  return out + ")";
}

pickle::ValuePtr to_pickle_value(const StateNode& node) {
  if (node.is_object()) return node.object() ? node.object() : pickle::Value::none();
  if (node.is_tensor()) throw UsageError("a tensor cannot be stored as an object");
  if (node.is_list()) {
    std::vector<pickle::ValuePtr> items;
    items.reserve(node.list().size());
    for (const StateNode& child : node.list()) items.push_back(to_pickle_value(child));
    return pickle::Value::list(std::move(items));
  }
  pickle::DictEntries entries;
  entries.reserve(node.dict().size());
  for (const auto& [key, child] : node.dict()) {
    entries.emplace_back(pickle::Value::str(key), to_pickle_value(child));
  }
  return pickle::Value::dict(std::move(entries));
}

}  // namespace shardpoint::engine
