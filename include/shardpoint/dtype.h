// Element types of tensors, named as PyTorch names them (without "torch.").
//
// The enum values are internal only (never persisted): files carry dtype names.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace shardpoint {

enum class DType {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kComplex32,
  kComplex64,
  kComplex128,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kBool,
  kFloat8_e4m3fn,
  kFloat8_e5m2,
  kFloat8_e4m3fnuz,
  kFloat8_e5m2fnuz,
  kFloat8_e8m0fnu,
};

inline constexpr DType kAllDTypes[] = {
    DType::kFloat32,        DType::kFloat64,     DType::kFloat16,         DType::kBFloat16,
    DType::kComplex32,      DType::kComplex64,   DType::kComplex128,      DType::kInt8,
    DType::kInt16,          DType::kInt32,       DType::kInt64,           DType::kUInt8,
    DType::kUInt16,         DType::kUInt32,      DType::kUInt64,          DType::kBool,
    DType::kFloat8_e4m3fn,  DType::kFloat8_e5m2, DType::kFloat8_e4m3fnuz, DType::kFloat8_e5m2fnuz,
    DType::kFloat8_e8m0fnu,
};

// PyTorch's canonical name, e.g. "float32", "bfloat16", "bool".
std::string_view dtype_name(DType dtype);

// Parses a canonical name or a PyTorch alias ("float", "half", "long", "cfloat", ...).
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes per element.
std::size_t dtype_itemsize(DType dtype);

}  // namespace shardpoint
