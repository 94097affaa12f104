#include "torch/tensor_adapter.h"

#include <ATen/Functions.h>

#include <fmt/format.h>

#include "shardpoint/error.h"

namespace shardpoint::torchx {

DType dtype_from_scalar_type(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float: return DType::kFloat32;
    case c10::ScalarType::Double: return DType::kFloat64;
    case c10::ScalarType::Half: return DType::kFloat16;
    case c10::ScalarType::BFloat16: return DType::kBFloat16;
    case c10::ScalarType::ComplexHalf: return DType::kComplex32;
    case c10::ScalarType::ComplexFloat: return DType::kComplex64;
    case c10::ScalarType::ComplexDouble: return DType::kComplex128;
    case c10::ScalarType::Char: return DType::kInt8;
    case c10::ScalarType::Short: return DType::kInt16;
    case c10::ScalarType::Int: return DType::kInt32;
    case c10::ScalarType::Long: return DType::kInt64;
    case c10::ScalarType::Byte: return DType::kUInt8;
    case c10::ScalarType::Bool: return DType::kBool;
    default: break;
  }
  throw UsageError(fmt::format("torch dtype {} has no checkpoint dtype", c10::toString(type)));
}

c10::ScalarType scalar_type_from_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kFloat64: return c10::ScalarType::Double;
    case DType::kFloat16: return c10::ScalarType::Half;
    case DType::kBFloat16: return c10::ScalarType::BFloat16;
    case DType::kComplex32: return c10::ScalarType::ComplexHalf;
    case DType::kComplex64: return c10::ScalarType::ComplexFloat;
    case DType::kComplex128: return c10::ScalarType::ComplexDouble;
    case DType::kInt8: return c10::ScalarType::Char;
    case DType::kInt16: return c10::ScalarType::Short;
    case DType::kInt32: return c10::ScalarType::Int;
    case DType::kInt64: return c10::ScalarType::Long;
    case DType::kUInt8: return c10::ScalarType::Byte;
    case DType::kBool: return c10::ScalarType::Bool;
    default: break;
  }
  throw UsageError(fmt::format("dtype {} has no LibTorch 1.13 equivalent", dtype_name(dtype)));
}

Shape shape_of(const at::Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end()); }

engine::TensorShard shard_of(const at::Tensor& t, const Shape& global_shape, const Shape& offsets) {
  if (!t.defined()) throw UsageError("shard_of: undefined tensor");
  if (!t.device().is_cpu()) throw UsageError(fmt::format("shard_of: tensor on {}, expected cpu", t.device().str()));
  if (!t.is_contiguous()) throw UsageError("shard_of: tensor is not contiguous");
  if (offsets.size() != static_cast<std::size_t>(t.dim()) || global_shape.size() != offsets.size()) {
    throw UsageError(fmt::format("shard_of: tensor of {} dims with {} offsets in a {}-dim global shape", t.dim(),
                                 offsets.size(), global_shape.size()));
  }
  engine::TensorShard s;
  s.dtype = dtype_from_scalar_type(t.scalar_type());
  s.global_shape = global_shape;
  s.offsets = offsets;
  s.sizes = shape_of(t);
  s.requires_grad = t.requires_grad();
  auto* p = static_cast<std::byte*>(t.data_ptr());
  s.data = std::span<std::byte>(p, static_cast<std::size_t>(t.numel()) * t.element_size());
  return s;
}

engine::TensorShard whole_of(const at::Tensor& t) {
  return shard_of(t, shape_of(t), Shape(static_cast<std::size_t>(t.dim()), 0));
}

at::Tensor tensor_of(const engine::TensorShard& shard) {
  const auto want = static_cast<std::size_t>(engine::volume(shard.sizes)) * dtype_itemsize(shard.dtype);
  if (shard.data.size() != want) {
    throw UsageError(fmt::format("tensor_of: box {} needs {} bytes, the shard has {}",
                                 engine::shape_to_string(shard.sizes), want, shard.data.size()));
  }
  std::vector<std::int64_t> sizes(shard.sizes.begin(), shard.sizes.end());
  return at::from_blob(shard.data.data(), sizes, at::TensorOptions().dtype(scalar_type_from_dtype(shard.dtype)));
}

engine::Box dim0_box(const Shape& global_shape, int rank, int world_size) {
  if (global_shape.empty()) return {};
  return engine::shard_box(global_shape, {world_size}, {engine::Placement::shard(0)}, {rank});
}

engine::StateNode dim0_sharded_state(const std::vector<NamedShard>& shards, int rank, int world_size) {
  engine::StateDict out;
  out.reserve(shards.size());
  for (const auto& s : shards) {
    const engine::Box box = dim0_box(s.global_shape, rank, world_size);
    if (shape_of(s.local) != box.sizes) {
      throw UsageError(fmt::format("{}: local tensor is {}, rank {} of {} owns box {}", s.name,
                                   engine::shape_to_string(shape_of(s.local)), rank, world_size,
                                   engine::box_to_string(box.offsets, box.sizes)));
    }
    out.emplace_back(s.name, engine::StateNode(shard_of(s.local, s.global_shape, box.offsets)));
  }
  return engine::StateNode(std::move(out));
}

at::Tensor dim0_slice(const at::Tensor& full, int rank, int world_size) {
  if (full.dim() == 0) return full.clone();
  const engine::Box box = dim0_box(shape_of(full), rank, world_size);
  return full.narrow(0, box.offsets[0], box.sizes[0]).contiguous().clone();
}

}  // namespace shardpoint::torchx
