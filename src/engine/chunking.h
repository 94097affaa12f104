// Boxes in a tensor's index space: how DTensor-style placements cut a tensor into them
// (docs/dcp-format.md §4.3), and how a tensor is walked in row-major boxes of bounded size
// (BoxCursor, for streaming copies).
//
// A box is [offsets, offsets + sizes) per dimension; a 0-dim tensor's box has no
// dimensions and one element. Shard(d) on a mesh dimension of size k gives coordinate c the
// rows [min(c*chunk, n), min((c+1)*chunk, n)) of tensor dim d, chunk = ceil(n / k), so the
// last coordinates may get empty boxes; Replicate keeps the full extent. Several mesh
// dimensions sharding the same tensor dimension nest left to right (the second splits the
// first's piece). Pure functions; thread-safe.
//
// Known difference: for an empty nested piece DTensor may report a smaller offset than the
// sum computed here (its compute_local_shape_and_global_offset replaces instead of adding
// when the outer offset is not larger); boxes with volume > 0 are identical.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "shardpoint/metadata.h"

namespace shardpoint::engine {

using format::Shape;

struct Placement {
  enum class Kind { kReplicate, kShard };
  Kind kind = Kind::kReplicate;
  int dim = 0;  // tensor dimension, for kShard

  static Placement replicate() { return {}; }
  static Placement shard(int dim) { return {Kind::kShard, dim}; }
  bool operator==(const Placement&) const = default;
};

struct Box {
  Shape offsets;
  Shape sizes;
  bool operator==(const Box&) const = default;
};

// Product of the sizes (1 for a 0-dim shape).
std::int64_t volume(const Shape& sizes);

// Strict overlap: every dimension's intervals intersect with positive length. Boxes with
// no dimensions overlap; a box with an empty dimension overlaps nothing.
// REQUIRES a and b have the same number of dimensions.
bool boxes_overlap(const Box& a, const Box& b);

// The intersection of a and b (sizes 0 where they do not meet).
Box intersect(const Box& a, const Box& b);

// "[0:4, 0:3]" (half-open ranges, as Python slices); "[]" for 0-dim.
std::string box_to_string(const Shape& offsets, const Shape& sizes);
// "[8, 3]"
std::string shape_to_string(const Shape& shape);

// The box of one mesh coordinate. REQUIRES placements.size() == mesh_shape.size() ==
// coordinate.size(); every Shard dim < global_shape.size(); mesh sizes > 0 and
// 0 <= coordinate < mesh size. Throws UsageError otherwise.
Box shard_box(const Shape& global_shape, const Shape& mesh_shape, const std::vector<Placement>& placements,
              const Shape& coordinate);

// The boxes of every mesh coordinate, in row-major coordinate order (the rank order of a
// DeviceMesh built from arange), as (offsets, sizes). Same errors as shard_box.
std::vector<std::pair<Shape, Shape>> shard_boxes(const Shape& global_shape, const Shape& mesh_shape,
                                                 const std::vector<Placement>& placements);

// The boxes (offsets, sizes, bytes) of a row-major tensor of `shape` in row-major order,
// each at most max_bytes (but at least one element): blocks along the first dimension
// whose sub-rows fit in max_bytes, single indices on the dimensions before it, so each box
// is one contiguous run of the tensor's bytes. A 0-dim tensor is one box with empty
// offsets/sizes; a tensor with no elements has none. One box at a time, so a huge tensor
// cut into small boxes is never listed whole. A cursor is used by one thread at a time.
class BoxCursor {
 public:
  BoxCursor(const Shape& shape, std::size_t itemsize, std::uint64_t max_bytes);
  // The next box; false when there are no more.
  bool next(Shape& offsets, Shape& sizes, std::uint64_t& bytes);

 private:
  Shape shape_;
  std::size_t scalar_bytes_ = 0;
  bool done_ = false;
  std::size_t d_ = 0;  // the dimension cut into blocks
  std::uint64_t row_ = 0;
  std::int64_t block_ = 1;
  std::int64_t start_ = 0;
  Shape offsets_;
  Shape sizes_;
};

// Visits BoxCursor's boxes in order: fn(offsets, sizes, bytes).
void for_each_box(const Shape& shape, std::size_t itemsize, std::uint64_t max_bytes,
                  const std::function<void(const Shape&, const Shape&, std::uint64_t)>& fn);

}  // namespace shardpoint::engine
