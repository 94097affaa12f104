// The LibTorch adapter: torch tensors (CPU, contiguous) seen as engine TensorShards and back,
// without copying, and the state-dict helper that builds an engine StateNode tree from named
// tensors sharded per tensor on dim 0 (FSDP2 / DTensor Shard(0) style, chunk = ceil(n / W),
// so the last ranks may hold a shorter or empty piece).
//
// Aliasing: a TensorShard made here points into the tensor's memory; keep the tensor alive
// (and unchanged while save() reads it) as long as the shard is used. A tensor made from a
// shard aliases the shard's bytes the same way.
// Only src/torch and src/train include LibTorch (narrow headers only). Thread-compatible.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/chunking.h"
#include "shardpoint/dtype.h"
#include "shardpoint/state_dict.h"

namespace shardpoint::torchx {

using engine::Shape;

// torch dtype <-> engine dtype. Throws UsageError for a dtype the other side lacks
// (e.g. quantized types; float8 kinds LibTorch 1.13 does not have).
DType dtype_from_scalar_type(c10::ScalarType type);
c10::ScalarType scalar_type_from_dtype(DType dtype);

// The tensor's sizes as a Shape.
Shape shape_of(const at::Tensor& t);

// A shard of a global tensor of `global_shape` at `offsets` whose bytes are t's memory.
// REQUIRES t defined, on CPU, contiguous; t.sizes() is the box; offsets.size() == t.dim().
// Throws UsageError naming what is wrong otherwise.
engine::TensorShard shard_of(const at::Tensor& t, const Shape& global_shape, const Shape& offsets);

// The whole tensor as a shard (offsets zero, global shape = t's shape).
engine::TensorShard whole_of(const at::Tensor& t);

// A CPU tensor aliasing the shard's bytes, shaped as the box (shard.sizes).
// REQUIRES shard.data.size() == volume(sizes) * itemsize (else UsageError).
at::Tensor tensor_of(const engine::TensorShard& shard);

// This rank's dim-0 box of a tensor of `global_shape` among world_size ranks (DTensor
// Shard(0): chunk = ceil(n0 / W); 0-dim tensors are replicated: the whole, empty box).
engine::Box dim0_box(const Shape& global_shape, int rank, int world_size);

// One named tensor shard: the local piece (CPU, contiguous) of a global tensor.
struct NamedShard {
  std::string name;
  at::Tensor local;
  Shape global_shape;
};

// A mapping node {name: TensorShard} in the given order, each shard at its dim-0 box
// offsets for `rank` (local.sizes() must equal the box sizes, else UsageError naming it).
engine::StateNode dim0_sharded_state(const std::vector<NamedShard>& shards, int rank, int world_size);

// The rows of `full` that rank owns under dim0_box, as a contiguous copy (a 0-dim tensor is
// copied whole).
at::Tensor dim0_slice(const at::Tensor& full, int rank, int world_size);

}  // namespace shardpoint::torchx
