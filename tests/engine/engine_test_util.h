// Builders shared by the engine tests: tensor shards without data (planning never reads
// data), objects, and a structural comparison of StateNode trees.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/flatten.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/state_dict.h"

namespace shardpoint::engine::testing {

inline TensorShard shard(Shape global, Shape offsets, Shape sizes, DType dtype = DType::kFloat32) {
  TensorShard t;
  t.dtype = dtype;
  t.global_shape = std::move(global);
  t.offsets = std::move(offsets);
  t.sizes = std::move(sizes);
  return t;
}

// A whole (unsharded) tensor of `shape`.
inline TensorShard whole(Shape shape, DType dtype = DType::kFloat32) {
  Shape zeros(shape.size(), 0);
  return shard(shape, zeros, shape, dtype);
}

inline StateNode obj(std::int64_t v) { return StateNode(pickle::Value::integer(v)); }
inline StateNode objf(double v) { return StateNode(pickle::Value::floating(v)); }
inline StateNode obj_str(std::string s) { return StateNode(pickle::Value::str(std::move(s))); }

inline std::vector<std::string> keys_of(const FlatStateDict& flat) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : flat.items) keys.push_back(k);
  return keys;
}

inline bool same_tree(const StateNode& a, const StateNode& b) {
  if (a.is_dict() != b.is_dict() || a.is_list() != b.is_list() || a.is_tensor() != b.is_tensor()) return false;
  if (a.is_dict()) {
    if (a.dict().size() != b.dict().size()) return false;
    for (const auto& [key, child] : a.dict()) {
      const StateNode* other = b.find(key);
      if (other == nullptr || !same_tree(child, *other)) return false;
    }
    return true;
  }
  if (a.is_list()) {
    if (a.list().size() != b.list().size()) return false;
    for (std::size_t i = 0; i < a.list().size(); ++i) {
      if (!same_tree(a.list()[i], b.list()[i])) return false;
    }
    return true;
  }
  if (a.is_tensor()) {
    return a.tensor().global_shape == b.tensor().global_shape && a.tensor().offsets == b.tensor().offsets &&
           a.tensor().sizes == b.tensor().sizes && a.tensor().dtype == b.tensor().dtype;
  }
  return pickle::deep_equal(*a.object(), *b.object());
}

}  // namespace shardpoint::engine::testing
