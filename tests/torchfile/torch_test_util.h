// Helpers shared by the torchfile tests: building torch.save files in memory with the
// writer, and walking a tree to paths as tests/torchfile/oracle_torch.py does.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/torch_file.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::torchfile::test {

// One tensor to write: contiguous row-major data.
struct TensorSpec {
  DType dtype;
  std::vector<std::int64_t> shape;
  std::string data;  // numel * itemsize bytes, little-endian
};

inline std::string pattern_bytes(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

inline std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

// Visits tensors (by TorchFile::tensor_of) and scalars under paths "", "/key", "/0".
struct TreeWalk {
  std::map<std::string, const TensorInfo*> tensors;
  std::map<std::string, const pickle::Value*> scalars;
};

inline void walk_tree(const TorchFile& f, const pickle::Value& v, const std::string& path, TreeWalk& out) {
  using pickle::Kind;
  if (const TensorInfo* t = f.tensor_of(v)) {
    out.tensors[path] = t;
    return;
  }
  auto key_text = [](const pickle::Value& k) {
    if (k.is(Kind::kStr)) return k.as_string();
    if (k.is(Kind::kInt)) return std::to_string(k.as_int());
    return std::string("?");
  };
  switch (v.kind()) {
    case Kind::kDict:
      for (const auto& [k, x] : v.entries()) walk_tree(f, *x, path + "/" + key_text(*k), out);
      break;
    case Kind::kList:
    case Kind::kTuple:
      for (std::size_t i = 0; i < v.items().size(); ++i)
        walk_tree(f, *v.items()[i], path + "/" + std::to_string(i), out);
      break;
    case Kind::kObject:
      if (v.callable() && v.callable()->is_global("collections", "OrderedDict")) {
        for (const auto& [k, x] : v.entries()) walk_tree(f, *x, path + "/" + key_text(*k), out);
        break;
      }
      out.scalars[path] = &v;
      break;
    default: out.scalars[path] = &v;
  }
}

// SHA-256 (hex) of the tensor's row-major bytes, streamed with for_each_run.
inline std::string tensor_sha256(const TorchFile& f, const TensorInfo& t) {
  Sha256 h;
  for_each_run(t, [&](std::uint64_t off, std::uint64_t n) {
    std::string buf = f.source().read_string(off, n, "test");
    h.update(as_bytes(buf));
  });
  return h.hex_digest();
}

inline std::string sha256_of(std::string_view s) {
  Sha256 h;
  h.update(as_bytes(s));
  return h.hex_digest();
}

}  // namespace shardpoint::torchfile::test
