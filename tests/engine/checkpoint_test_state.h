// A deterministic training-like state for save/load tests, shared by the in-process tests
// (checkpoint_test.cc) and the multi-process worker (engine_worker.cc).
//
// Global content (every value is a function of the element's global index, so any rank of
// any world size knows what its box must hold):
//   model.w        float32 [10, 3]   Shard(0)   (uneven: 4 ranks get 3, 3, 3, 1 rows)
//   model.v        bfloat16 [7]      Shard(0)
//   model.c        int32 [4, 7]      Shard(1)   (dim-1 sharded: one run per row)
//   model.rep      float64 [5]       replicated
//   model.scalar   float32 []        replicated 0-dim
//   optim.state.0.exp_avg  float32 [10, 3] Shard(0)
//   optim.state.0.step     int 3
//   optim.param_groups     [{"lr": 0.01, "name": "adam", "params": [0, 1]}]
//   epoch 7, tag "run-1"
// Header-only; no gtest dependency (the worker uses it too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/chunking.h"
#include "shardpoint/dtype.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/state_dict.h"

namespace shardpoint::engine::testing {

struct TensorSpec {
  std::string path;  // dotted, for messages
  DType dtype;
  Shape shape;
  int shard_dim;  // -1: replicated
};

inline const std::vector<TensorSpec>& tensor_specs() {
  static const std::vector<TensorSpec> specs = {
      {"model.w", DType::kFloat32, {10, 3}, 0},  {"model.v", DType::kBFloat16, {7}, 0},
      {"model.c", DType::kInt32, {4, 7}, 1},     {"model.rep", DType::kFloat64, {5}, -1},
      {"model.scalar", DType::kFloat32, {}, -1}, {"optim.state.0.exp_avg", DType::kFloat32, {10, 3}, 0},
  };
  return specs;
}

// Byte k of element `index` of tensor `name`. float32 tensors hold index * 0.5 + salt
// (exact values, readable by torch); other dtypes a byte pattern.
inline void element_bytes(const TensorSpec& spec, std::int64_t index, std::byte* out) {
  const std::size_t itemsize = dtype_itemsize(spec.dtype);
  if (spec.dtype == DType::kFloat32) {
    const float salt = spec.path == "model.w" ? 1.0f : spec.path == "model.scalar" ? 42.25f : -3.0f;
    const float v = static_cast<float>(index) * 0.5f + salt;
    std::memcpy(out, &v, sizeof v);
    return;
  }
  std::uint32_t h = 2166136261u;
  for (char c : spec.path) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  for (std::size_t k = 0; k < itemsize; ++k) {
    out[k] = static_cast<std::byte>((h + static_cast<std::uint32_t>(index) * 37u + k * 11u) & 0xff);
  }
}

// The box of `rank` of `world` for spec (Shard(d) over a 1-D mesh, DTensor's split).
inline Box box_of(const TensorSpec& spec, int rank, int world) {
  if (spec.shard_dim < 0) return Box{Shape(spec.shape.size(), 0), spec.shape};
  return shard_box(spec.shape, {world}, {Placement::shard(spec.shard_dim)}, {rank});
}

// The row-major bytes of box of spec.
inline std::vector<std::byte> box_bytes(const TensorSpec& spec, const Box& box) {
  const std::size_t itemsize = dtype_itemsize(spec.dtype);
  const std::int64_t n = volume(box.sizes);
  std::vector<std::byte> out(static_cast<std::size_t>(n) * itemsize);
  const std::size_t dims = box.sizes.size();
  std::vector<std::int64_t> idx(dims, 0);
  for (std::int64_t e = 0; e < n; ++e) {
    std::int64_t global = 0;
    for (std::size_t d = 0; d < dims; ++d) global = global * spec.shape[d] + box.offsets[d] + idx[d];
    element_bytes(spec, global, out.data() + static_cast<std::size_t>(e) * itemsize);
    for (std::size_t d = dims; d-- > 0;) {
      if (++idx[d] < box.sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

inline pickle::ValuePtr param_groups_value() {
  using pickle::Value;
  return Value::list({Value::dict({{Value::str("lr"), Value::floating(0.01)},
                                   {Value::str("name"), Value::str("adam")},
                                   {Value::str("params"), Value::list({Value::integer(0), Value::integer(1)})}})});
}

// One rank's state: the tree and the buffers its tensor leaves point into.
struct RankState {
  std::vector<std::unique_ptr<std::vector<std::byte>>> buffers;  // one per tensor_specs() entry
  StateNode root;

  // Places node at the dotted path (dicts created as needed).
  void put(const std::string& dotted, StateNode node) {
    StateNode* at = &root;
    std::size_t start = 0;
    for (;;) {
      const std::size_t dot = dotted.find('.', start);
      const std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (dot == std::string::npos) {
        at->set(key, std::move(node));
        return;
      }
      StateNode* next = at->find(key);
      if (next == nullptr) next = &at->set(key, StateNode(StateDict{}));
      at = next;
      start = dot + 1;
    }
  }
};

// filled: the saved values (for save, and as the expected result). Otherwise zeroed
// buffers and None placeholders: a load template.
inline RankState make_rank_state(int rank, int world, bool filled) {
  RankState s;
  for (const TensorSpec& spec : tensor_specs()) {
    const Box box = box_of(spec, rank, world);
    auto buffer = std::make_unique<std::vector<std::byte>>(box_bytes(spec, box));
    if (!filled) std::fill(buffer->begin(), buffer->end(), std::byte{0});
    TensorShard t;
    t.dtype = spec.dtype;
    t.global_shape = spec.shape;
    t.offsets = box.offsets;
    t.sizes = box.sizes;
    t.data = std::span<std::byte>(buffer->data(), buffer->size());
    s.buffers.push_back(std::move(buffer));
    s.put(spec.path, StateNode(std::move(t)));
  }
  using pickle::Value;
  auto obj = [&](pickle::ValuePtr v) { return StateNode(filled ? std::move(v) : Value::none()); };
  s.put("optim.state.0.step", obj(Value::integer(3)));
  s.put("epoch", obj(Value::integer(7)));
  s.put("tag", obj(Value::str("run-1")));
  // param_groups: a list of dicts (descended by the 2.4 flattening: one item per leaf).
  StateDict group;
  group.emplace_back("lr", obj(Value::floating(0.01)));
  group.emplace_back("name", obj(Value::str("adam")));
  group.emplace_back("params", obj(Value::list({Value::integer(0), Value::integer(1)})));
  StateList groups;
  groups.emplace_back(std::move(group));
  s.root.find("optim")->set("param_groups", StateNode(std::move(groups)));
  return s;
}

// Empty when `got` (a loaded template of rank/world) holds exactly the saved state;
// otherwise a description of the first difference.
inline std::string compare_with_expected(const RankState& got, int rank, int world) {
  const RankState want = make_rank_state(rank, world, true);
  const auto& specs = tensor_specs();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (*got.buffers[i] != *want.buffers[i]) {
      const auto& a = *got.buffers[i];
      const auto& b = *want.buffers[i];
      std::size_t k = 0;
      while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
      return specs[i].path + ": bytes differ at " + std::to_string(k) + " of " + std::to_string(b.size());
    }
  }
  const char* objects[] = {"optim.state.0.step", "epoch", "tag"};
  auto find = [](const StateNode& root, const std::string& dotted) -> const StateNode* {
    const StateNode* at = &root;
    std::size_t start = 0;
    for (;;) {
      const std::size_t dot = dotted.find('.', start);
      if (!at->is_dict()) return nullptr;
      at = at->find(dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (at == nullptr || dot == std::string::npos) return at;
      start = dot + 1;
    }
  };
  for (const char* path : objects) {
    const StateNode* g = find(got.root, path);
    const StateNode* w = find(want.root, path);
    if (g == nullptr || !g->is_object() || !g->object() || !pickle::deep_equal(*g->object(), *w->object())) {
      return std::string(path) + ": object differs";
    }
  }
  const StateNode* groups = find(got.root, "optim.param_groups");
  if (groups == nullptr || !groups->is_list() || groups->list().size() != 1 || !groups->list()[0].is_dict()) {
    return "optim.param_groups: not a list of one dict";
  }
  const StateNode& g0 = groups->list()[0];
  const auto* lr = g0.find("lr");
  const auto* name = g0.find("name");
  const auto* params = g0.find("params");
  if (lr == nullptr || !lr->is_object() || !lr->object() || !lr->object()->is(pickle::Kind::kFloat) ||
      lr->object()->as_float() != 0.01) {
    return "optim.param_groups.0.lr differs";
  }
  if (name == nullptr || !name->is_object() || !name->object() ||
      !pickle::deep_equal(*name->object(), *pickle::Value::str("adam"))) {
    return "optim.param_groups.0.name differs";
  }
  if (params == nullptr || !params->is_object() || !params->object() ||
      !pickle::deep_equal(*params->object(),
                          *pickle::Value::list({pickle::Value::integer(0), pickle::Value::integer(1)}))) {
    return "optim.param_groups.0.params differs";
  }
  return {};
}

}  // namespace shardpoint::engine::testing
