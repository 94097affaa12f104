#include "pickle/tree_edit.h"

#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace shardpoint::pickle {
namespace {

// Calls fn on every child slot of v (dict keys and values, items).
template <typename Fn>
void for_each_child_slot(Value& v, Fn&& fn) {
  switch (v.kind()) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kSet:
    case Kind::kFrozenSet:
      for (auto& i : v.mutable_items()) fn(i);
      break;
    case Kind::kDict:
      for (auto& [k, x] : v.mutable_entries()) {
        fn(k);
        fn(x);
      }
      break;
    default: break;
  }
}

class NodeReplacer {
 public:
  explicit NodeReplacer(const std::function<ValuePtr(const ValuePtr&)>& replacement) : replacement_(replacement) {}

  void visit(ValuePtr& slot) {
    if (!slot) return;
    if (auto done = replaced_.find(slot.get()); done != replaced_.end()) {
      slot = done->second;
      return;
    }
    if (visited_.count(slot.get())) return;
    if (ValuePtr made = replacement_(slot)) {
      keep_.push_back(slot);  // its address stays a key of replaced_ until the walk ends
      replaced_.emplace(slot.get(), made);
      slot = std::move(made);
      return;
    }
    visited_.insert(slot.get());
    Value& v = *slot;
    if (v.is(Kind::kObject)) {
      // The pickler's order: the call, then appended items and set entries, then BUILD.
      for (const ValuePtr* p : {&v.callable(), &v.args(), &v.kwargs()}) {
        if (*p) for_each_child_slot(**p, [&](ValuePtr& s) { visit(s); });
      }
      for (auto& i : v.mutable_items()) visit(i);
      for (auto& [k, x] : v.mutable_entries()) {
        visit(k);
        visit(x);
      }
      if (v.state()) for_each_child_slot(*v.state(), [&](ValuePtr& s) { visit(s); });
      return;
    }
    for_each_child_slot(v, [&](ValuePtr& s) { visit(s); });
  }

 private:
  const std::function<ValuePtr(const ValuePtr&)>& replacement_;
  std::unordered_map<const Value*, ValuePtr> replaced_;
  std::unordered_set<const Value*> visited_;
  std::vector<ValuePtr> keep_;
};

bool holds_persistent_id(const Value& v, std::unordered_set<const Value*>& seen) {
  if (!seen.insert(&v).second) return false;
  if (v.is(Kind::kPersistentId)) return true;
  auto check = [&](const ValuePtr& p) { return p && holds_persistent_id(*p, seen); };
  switch (v.kind()) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kSet:
    case Kind::kFrozenSet:
      for (const auto& i : v.items()) {
        if (check(i)) return true;
      }
      return false;
    case Kind::kDict:
      for (const auto& [k, x] : v.entries()) {
        if (check(k) || check(x)) return true;
      }
      return false;
    case Kind::kObject:
      if (check(v.callable()) || check(v.args()) || check(v.kwargs()) || check(v.state())) return true;
      for (const auto& i : v.items()) {
        if (check(i)) return true;
      }
      for (const auto& [k, x] : v.entries()) {
        if (check(k) || check(x)) return true;
      }
      return false;
    default: return false;
  }
}

}  // namespace

void replace_nodes(ValuePtr& root, const std::function<ValuePtr(const ValuePtr&)>& replacement) {
  NodeReplacer(replacement).visit(root);
}

bool holds_persistent_id(const Value& v) {
  std::unordered_set<const Value*> seen;
  return holds_persistent_id(v, seen);
}

}  // namespace shardpoint::pickle
