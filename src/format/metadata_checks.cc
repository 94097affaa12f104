// The consistency checks of a decoded `.metadata` (metadata_codec.h): how chunks tile a
// tensor, and check_metadata() for `verify`. Pure functions of values.
#include "format/metadata_codec.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "format/checkpoint_path.h"
#include "format/metadata_codec_text.h"

namespace shardpoint::format {
namespace {

using codec_text::has_negative;
using codec_text::quote;
using codec_text::shape_text;

std::optional<std::uint64_t> checked_volume(const Shape& sizes) {
  std::uint64_t v = 1;
  for (std::int64_t d : sizes) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(v, static_cast<std::uint64_t>(d), &v)) return std::nullopt;
  }
  return v;
}

}  // namespace

std::string describe_chunk(const ChunkStorageMetadata& chunk) {
  std::string out = "[";
  const std::size_t n = std::max(chunk.offsets.size(), chunk.sizes.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    if (i >= chunk.offsets.size() || i >= chunk.sizes.size()) {
      out += "?";
      continue;
    }
    std::int64_t o = chunk.offsets[i], s = chunk.sizes[i], end = 0;
    out += std::to_string(o) + ":";
    out += __builtin_add_overflow(o, s, &end) ? std::to_string(o) + "+" + std::to_string(s) : std::to_string(end);
  }
  return out + "]";
}

std::vector<std::string> check_chunk_tiling(const TensorStorageMetadata& tensor) {
  constexpr std::size_t kMaxOverlapReports = 20;
  std::vector<std::string> problems;
  const Shape& size = tensor.size;
  const std::size_t rank = size.size();
  if (has_negative(size)) {
    problems.push_back("tensor size " + shape_text(size) + " has a negative dimension");
    return problems;
  }
  std::optional<std::uint64_t> total = checked_volume(size);
  if (!total) problems.push_back("tensor size " + shape_text(size) + ": element count does not fit in 64 bits");

  std::vector<std::size_t> valid;
  for (std::size_t i = 0; i < tensor.chunks.size(); ++i) {
    const ChunkStorageMetadata& c = tensor.chunks[i];
    const std::string name = "chunk " + std::to_string(i) + " " + describe_chunk(c);
    if (c.offsets.size() != rank || c.sizes.size() != rank) {
      problems.push_back(name + " has rank " + std::to_string(c.offsets.size()) + "/" + std::to_string(c.sizes.size()) +
                         " (offsets/sizes), the tensor has rank " + std::to_string(rank));
      continue;
    }
    if (has_negative(c.offsets) || has_negative(c.sizes)) {
      problems.push_back(name + " has a negative offset or size");
      continue;
    }
    bool inside = true;
    for (std::size_t d = 0; d < rank; ++d) {
      // offsets + sizes <= size, without overflowing.
      if (c.offsets[d] > size[d] || c.sizes[d] > size[d] - c.offsets[d]) inside = false;
    }
    if (!inside) {
      problems.push_back(name + " lies outside the tensor of size " + shape_text(size));
      continue;
    }
    valid.push_back(i);
  }

  // Overlaps: strict box intersection. Sweep along the dimension with the most distinct
  // offsets so that typical shardings compare few pairs.
  std::size_t sweep_dim = 0;
  if (rank > 0) {
    std::size_t best = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      std::set<std::int64_t> distinct;
      for (std::size_t i : valid) distinct.insert(tensor.chunks[i].offsets[d]);
      if (distinct.size() > best) {
        best = distinct.size();
        sweep_dim = d;
      }
    }
  }
  auto is_empty = [&](std::size_t i) {
    const Shape& s = tensor.chunks[i].sizes;
    return std::any_of(s.begin(), s.end(), [](std::int64_t x) { return x == 0; });
  };
  std::vector<std::size_t> order;
  for (std::size_t i : valid) {
    if (!is_empty(i)) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return rank > 0 && tensor.chunks[a].offsets[sweep_dim] < tensor.chunks[b].offsets[sweep_dim];
  });
  std::size_t overlaps = 0;
  for (std::size_t x = 0; x < order.size(); ++x) {
    const ChunkStorageMetadata& a = tensor.chunks[order[x]];
    for (std::size_t y = x + 1; y < order.size(); ++y) {
      const ChunkStorageMetadata& b = tensor.chunks[order[y]];
      // In bounds, so offset + size cannot overflow.
      if (rank > 0 && b.offsets[sweep_dim] >= a.offsets[sweep_dim] + a.sizes[sweep_dim]) break;
      bool overlap = true;
      for (std::size_t d = 0; d < rank && overlap; ++d) {
        overlap = a.offsets[d] < b.offsets[d] + b.sizes[d] && b.offsets[d] < a.offsets[d] + a.sizes[d];
      }
      if (!overlap) continue;
      if (++overlaps <= kMaxOverlapReports) {
        std::size_t first = std::min(order[x], order[y]), second = std::max(order[x], order[y]);
        problems.push_back("chunk " + std::to_string(second) + " " + describe_chunk(tensor.chunks[second]) +
                           " overlaps chunk " + std::to_string(first) + " " + describe_chunk(tensor.chunks[first]));
      }
    }
  }
  if (overlaps > kMaxOverlapReports) {
    problems.push_back("... and " + std::to_string(overlaps - kMaxOverlapReports) + " more overlapping pairs");
  }

  // Coverage: with no overlaps, the chunks tile the tensor iff their volumes sum to its.
  if (overlaps == 0 && total) {
    std::uint64_t covered = 0;
    bool overflow = false;
    for (std::size_t i : valid) {
      std::optional<std::uint64_t> v = checked_volume(tensor.chunks[i].sizes);
      if (!v || __builtin_add_overflow(covered, *v, &covered)) overflow = true;
    }
    if (overflow) {
      problems.push_back("chunk volumes do not fit in 64 bits");
    } else if (covered != *total) {
      problems.push_back("chunks cover " + std::to_string(covered) + " of " + std::to_string(*total) +
                         " elements (gaps)");
    }
  }
  return problems;
}

std::vector<std::string> check_metadata(const Metadata& md) {
  std::vector<std::string> problems;
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      for (const std::string& p : check_chunk_tiling(*t)) problems.push_back(quote(fqn) + ": " + p);
      for (std::size_t i = 0; i < t->chunks.size(); ++i) {
        if (!md.storage_data.contains(MetadataIndex{fqn, t->chunks[i].offsets, std::nullopt})) {
          problems.push_back(quote(fqn) + ": chunk " + std::to_string(i) + " " + describe_chunk(t->chunks[i]) +
                             " has no storage_data entry");
        }
      }
    } else if (!md.storage_data.contains(MetadataIndex{fqn, std::nullopt, std::nullopt})) {
      problems.push_back(quote(fqn) + ": bytes item has no storage_data entry");
    }
  }
  // file -> (offset, length, fqn), to find items sharing bytes.
  std::map<std::string, std::vector<std::tuple<std::uint64_t, std::uint64_t, std::string>>> by_file;
  for (const auto& [index, info] : md.storage_data) {
    const std::string key =
        "storage_data[" + quote(index.fqn) + (index.offset ? " at " + shape_text(*index.offset) : std::string()) + "]";
    auto it = md.state_dict_metadata.find(index.fqn);
    if (it == md.state_dict_metadata.end()) {
      problems.push_back(key + " names no item of state_dict_metadata");
    } else if (const auto* t = std::get_if<TensorStorageMetadata>(&it->second)) {
      const std::optional<Shape>& offset = index.offset;
      bool found = offset && std::any_of(t->chunks.begin(), t->chunks.end(),
                                         [&](const ChunkStorageMetadata& c) { return c.offsets == *offset; });
      if (!found) problems.push_back(key + " matches no chunk of the tensor");
    } else if (index.offset) {
      problems.push_back(key + " has an offset, but the item is a bytes item");
    }
    if (!is_safe_relative_path(info.relative_path)) {
      problems.push_back(key + ": relative_path '" + info.relative_path + "' is not a plain relative path");
    }
    by_file[info.relative_path].emplace_back(info.offset, info.length, key);
  }
  for (auto& [file, items] : by_file) {
    std::sort(items.begin(), items.end());
    for (std::size_t i = 1; i < items.size(); ++i) {
      const auto& [prev_off, prev_len, prev_key] = items[i - 1];
      const auto& [off, len, key] = items[i];
      std::uint64_t prev_end = 0;
      const bool overflow = __builtin_add_overflow(prev_off, prev_len, &prev_end);
      if ((overflow || off < prev_end) && len > 0 && prev_len > 0) {
        std::string problem = key + " [" + std::to_string(off) + "+" + std::to_string(len) + "] overlaps ";
        problem += prev_key;
        problem += " [" + std::to_string(prev_off) + "+" + std::to_string(prev_len) + "] in '";
        problem += file;
        problem += "'";
        problems.push_back(std::move(problem));
      }
    }
  }
  return problems;
}

}  // namespace shardpoint::format
