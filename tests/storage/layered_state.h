// A GPT-like engine state for tests that count reads (s3_checkpoint_test, azure_engine_test).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardpoint/dtype.h"
#include "shardpoint/state_dict.h"

namespace shardpoint::storage::testing {

// A GPT-like state for counting reads: layer i has "l<i>.step" (float32 [], on every rank,
// as Adam's step) and, with weights, "l<i>.w" (float32 [world * 32768], Shard(0): 128 KiB per
// rank). In fqn order each file's steps lie between its weights.
struct LayeredState {
  std::vector<std::vector<float>> buffers;
  engine::StateNode root;
};

inline LayeredState layered_state(std::int64_t rank, std::int64_t world, std::size_t layers, bool with_weights,
                                  bool filled) {
  constexpr std::int64_t kRows = 32768;
  LayeredState s;
  s.buffers.resize(2 * layers);
  engine::StateDict d;
  for (std::size_t i = 0; i < layers; ++i) {
    auto tensor = [&](std::vector<float>& buffer, format::Shape global, format::Shape offsets, format::Shape sizes) {
      engine::TensorShard t;
      t.dtype = DType::kFloat32;
      t.global_shape = std::move(global);
      t.offsets = std::move(offsets);
      t.sizes = std::move(sizes);
      t.data = std::as_writable_bytes(std::span(buffer));
      return engine::StateNode(std::move(t));
    };
    std::vector<float>& step = s.buffers[2 * i];
    step.assign(1, filled ? static_cast<float>(i + 1) : 0.0f);
    d.emplace_back("l" + std::to_string(i) + ".step", tensor(step, {}, {}, {}));
    if (!with_weights) continue;
    std::vector<float>& w = s.buffers[2 * i + 1];
    w.resize(kRows);
    for (std::int64_t k = 0; k < kRows; ++k) {
      w[static_cast<std::size_t>(k)] =
          filled ? static_cast<float>(static_cast<std::int64_t>(i) * 1000 + rank * kRows + k) : 0.0f;
    }
    d.emplace_back("l" + std::to_string(i) + ".w", tensor(w, {world * kRows}, {rank * kRows}, {kRows}));
  }
  s.root = engine::StateNode(std::move(d));
  return s;
}

}  // namespace shardpoint::storage::testing
