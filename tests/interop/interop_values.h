// The interop value function, the C++ twin of tests/interop/dcp26.py's expected_full():
// every element of every tensor is a function of (fqn, global row-major index), so a rank
// of any world size can recompute what its box must hold, whoever saved it.
//
//   h = FNV-1a 32-bit of the fqn's UTF-8 bytes
//   m = (h + 7919 * i) mod 1000
//   float32 / float64 / float16:  (m - 500) / 8           (exact in all three)
//   bfloat16:                     (m mod 256 - 128) / 2   (8 significant bits: exact)
//   int64:                        (m - 500) * 1000000007
//   int32 / int16:                m - 500
//   int8:                         m mod 256 - 128
//   uint8:                        m mod 256
//   bool:                         m mod 2
// Little-endian host only (as the checkpoints). Header-only; no gtest dependency.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/chunking.h"
#include "shardpoint/dtype.h"

namespace shardpoint::interop {

static_assert(std::endian::native == std::endian::little, "interop values assume a little-endian host");

inline std::uint32_t fnv1a32(const std::string& text) {
  std::uint32_t h = 2166136261u;
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return h;
}

// float32 -> IEEE half bits, for values exactly representable as normal halves or zero
// (all the function produces). Throws otherwise, so a wrong table cannot pass silently.
inline std::uint16_t exact_half_bits(float v) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(v);
  const std::uint16_t sign = static_cast<std::uint16_t>((f >> 16) & 0x8000u);
  if ((f & 0x7fffffffu) == 0) return sign;
  const int exp = static_cast<int>((f >> 23) & 0xff) - 127 + 15;
  const std::uint32_t mant = f & 0x7fffffu;
  if (exp <= 0 || exp >= 31 || (mant & 0x1fffu) != 0) throw std::logic_error("value not exact in float16");
  return static_cast<std::uint16_t>(sign | (exp << 10) | (mant >> 13));
}

// Writes element `index` of tensor `fqn` (dtype) to out (itemsize bytes).
inline void element_bytes(const std::string& fqn, DType dtype, std::int64_t index, std::byte* out) {
  const std::uint64_t m =
      (static_cast<std::uint64_t>(fnv1a32(fqn)) + 7919u * static_cast<std::uint64_t>(index)) % 1000u;
  const std::int64_t c = static_cast<std::int64_t>(m) - 500;
  auto put = [&](auto v) { std::memcpy(out, &v, sizeof v); };
  switch (dtype) {
    case DType::kFloat32: put(static_cast<float>(c) / 8.0f); return;
    case DType::kFloat64: put(static_cast<double>(c) / 8.0); return;
    case DType::kFloat16: put(exact_half_bits(static_cast<float>(c) / 8.0f)); return;
    case DType::kBFloat16: {
      const float v = static_cast<float>(static_cast<std::int64_t>(m % 256) - 128) / 2.0f;
      const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
      if ((bits & 0xffffu) != 0) throw std::logic_error("value not exact in bfloat16");
      put(static_cast<std::uint16_t>(bits >> 16));
      return;
    }
    case DType::kInt64: put(static_cast<std::int64_t>(c * 1000000007)); return;
    case DType::kInt32: put(static_cast<std::int32_t>(c)); return;
    case DType::kInt16: put(static_cast<std::int16_t>(c)); return;
    case DType::kInt8: put(static_cast<std::int8_t>(static_cast<std::int64_t>(m % 256) - 128)); return;
    case DType::kUInt8: put(static_cast<std::uint8_t>(m % 256)); return;
    case DType::kBool: put(static_cast<std::uint8_t>(m % 2)); return;
    default: throw std::invalid_argument(fqn + ": dtype " + std::string(dtype_name(dtype)) + " has no interop values");
  }
}

// Row-major bytes of `box` of the global tensor fqn (dtype, shape).
inline std::vector<std::byte> box_bytes(const std::string& fqn, DType dtype, const engine::Shape& shape,
                                        const engine::Box& box) {
  const std::size_t itemsize = dtype_itemsize(dtype);
  const std::int64_t n = engine::volume(box.sizes);
  std::vector<std::byte> out(static_cast<std::size_t>(n) * itemsize);
  const std::size_t dims = box.sizes.size();
  std::vector<std::int64_t> idx(dims, 0);
  for (std::int64_t e = 0; e < n; ++e) {
    std::int64_t global = 0;
    for (std::size_t d = 0; d < dims; ++d) global = global * shape[d] + box.offsets[d] + idx[d];
    element_bytes(fqn, dtype, global, out.data() + static_cast<std::size_t>(e) * itemsize);
    for (std::size_t d = dims; d-- > 0;) {
      if (++idx[d] < box.sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace shardpoint::interop
