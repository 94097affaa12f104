// The state dict a rank hands to save() or fills with load(): a nested tree of dicts and
// lists whose leaves are tensor shards or objects (pickle values).
//
// A TensorShard is this rank's box of one global tensor: the global shape, the box
// (offsets, sizes) and the box's bytes in row-major order. A replicated tensor is a shard
// whose box is the whole tensor on every rank (save deduplicates it). A 0-dim tensor has
// empty shape/offsets/sizes and one element.
//
// The tree does not own tensor memory: `data` points at the caller's buffer, which must
// stay valid (and, for save, unchanged) until the call returns.
// Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "shardpoint/dtype.h"
#include "shardpoint/metadata.h"
#include "shardpoint/pickle_value.h"

namespace shardpoint::engine {

using format::Shape;

struct TensorShard {
  DType dtype = DType::kFloat32;
  Shape global_shape;
  Shape offsets;  // of this box in the global tensor
  Shape sizes;    // of this box
  // Row-major bytes of the box: product(sizes) * itemsize bytes. save() reads them;
  // load() writes them.
  std::span<std::byte> data;
  bool requires_grad = false;
};

class StateNode;
using StateDict = std::vector<std::pair<std::string, StateNode>>;  // ordered mapping
using StateList = std::vector<StateNode>;

// One node: a mapping, a list, a tensor shard, or an object (any pickle value: numbers,
// strings, tuples, user objects...).
class StateNode {
 public:
  using Storage = std::variant<StateDict, StateList, TensorShard, pickle::ValuePtr>;

  StateNode() : node_(StateDict{}) {}
  StateNode(StateDict d) : node_(std::move(d)) {}
  StateNode(StateList l) : node_(std::move(l)) {}
  StateNode(TensorShard t) : node_(std::move(t)) {}
  StateNode(pickle::ValuePtr v) : node_(std::move(v)) {}

  bool is_dict() const { return std::holds_alternative<StateDict>(node_); }
  bool is_list() const { return std::holds_alternative<StateList>(node_); }
  bool is_tensor() const { return std::holds_alternative<TensorShard>(node_); }
  bool is_object() const { return std::holds_alternative<pickle::ValuePtr>(node_); }

  StateDict& dict() { return std::get<StateDict>(node_); }
  const StateDict& dict() const { return std::get<StateDict>(node_); }
  StateList& list() { return std::get<StateList>(node_); }
  const StateList& list() const { return std::get<StateList>(node_); }
  TensorShard& tensor() { return std::get<TensorShard>(node_); }
  const TensorShard& tensor() const { return std::get<TensorShard>(node_); }
  pickle::ValuePtr& object() { return std::get<pickle::ValuePtr>(node_); }
  const pickle::ValuePtr& object() const { return std::get<pickle::ValuePtr>(node_); }

  // Mapping lookup by key (REQUIRES is_dict()); nullptr when absent.
  StateNode* find(const std::string& key);
  const StateNode* find(const std::string& key) const;
  // Inserts or replaces key (REQUIRES is_dict()); returns the stored node.
  StateNode& set(const std::string& key, StateNode value);

 private:
  Storage node_;
};

}  // namespace shardpoint::engine
