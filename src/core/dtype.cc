#include "shardpoint/dtype.h"

#include <utility>

namespace shardpoint {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t itemsize;
};

constexpr DTypeInfo kInfos[] = {
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kComplex32, "complex32", 4},
    {DType::kComplex64, "complex64", 8},
    {DType::kComplex128, "complex128", 16},
    {DType::kInt8, "int8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kUInt8, "uint8", 1},
    {DType::kUInt16, "uint16", 2},
    {DType::kUInt32, "uint32", 4},
    {DType::kUInt64, "uint64", 8},
    {DType::kBool, "bool", 1},
    {DType::kFloat8_e4m3fn, "float8_e4m3fn", 1},
    {DType::kFloat8_e5m2, "float8_e5m2", 1},
    {DType::kFloat8_e4m3fnuz, "float8_e4m3fnuz", 1},
    {DType::kFloat8_e5m2fnuz, "float8_e5m2fnuz", 1},
    {DType::kFloat8_e8m0fnu, "float8_e8m0fnu", 1},
};

constexpr std::pair<std::string_view, DType> kAliases[] = {
    {"float", DType::kFloat32},   {"double", DType::kFloat64},   {"half", DType::kFloat16},
    {"chalf", DType::kComplex32}, {"cfloat", DType::kComplex64}, {"cdouble", DType::kComplex128},
    {"short", DType::kInt16},     {"int", DType::kInt32},        {"long", DType::kInt64},
};

const DTypeInfo& info(DType dtype) {
  for (const auto& i : kInfos) {
    if (i.dtype == dtype) return i;
  }
  return kInfos[0];  // unreachable: every enumerator has an entry
}

}  // namespace

std::string_view dtype_name(DType dtype) { return info(dtype).name; }

std::size_t dtype_itemsize(DType dtype) { return info(dtype).itemsize; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfos) {
    if (i.name == name) return i.dtype;
  }
  for (const auto& [alias, dtype] : kAliases) {
    if (alias == name) return dtype;
  }
  return std::nullopt;
}

}  // namespace shardpoint
