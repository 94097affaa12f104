#include "shardpoint/state_dict.h"

namespace shardpoint::engine {

StateNode* StateNode::find(const std::string& key) {
  for (auto& [k, v] : dict()) {
    if (k == key) return &v;
  }
  return nullptr;
}

const StateNode* StateNode::find(const std::string& key) const {
  for (const auto& [k, v] : dict()) {
    if (k == key) return &v;
  }
  return nullptr;
}

StateNode& StateNode::set(const std::string& key, StateNode value) {
  if (StateNode* existing = find(key)) {
    *existing = std::move(value);
    return *existing;
  }
  dict().emplace_back(key, std::move(value));
  return dict().back().second;
}

}  // namespace shardpoint::engine
