#include "engine/chunking.h"

#include <algorithm>

#include "shardpoint/error.h"

namespace shardpoint::engine {

std::int64_t volume(const Shape& sizes) {
  std::int64_t n = 1;
  for (std::int64_t s : sizes) n *= s;
  return n;
}

bool boxes_overlap(const Box& a, const Box& b) {
  for (std::size_t d = 0; d < a.sizes.size(); ++d) {
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d]) return false;
    if (b.offsets[d] >= a.offsets[d] + a.sizes[d]) return false;
  }
  return true;
}

Box intersect(const Box& a, const Box& b) {
  Box out;
  for (std::size_t d = 0; d < a.sizes.size(); ++d) {
    std::int64_t begin = std::max(a.offsets[d], b.offsets[d]);
    std::int64_t end = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    out.offsets.push_back(begin);
    out.sizes.push_back(std::max<std::int64_t>(0, end - begin));
  }
  return out;
}

std::string box_to_string(const Shape& offsets, const Shape& sizes) {
  std::string out = "[";
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(offsets[d]) + ":" + std::to_string(offsets[d] + sizes[d]);
  }
  return out + "]";
}

std::string shape_to_string(const Shape& shape) {
  std::string out = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) out += ", ";
    out += std::to_string(shape[d]);
  }
  return out + "]";
}

Box shard_box(const Shape& global_shape, const Shape& mesh_shape, const std::vector<Placement>& placements,
              const Shape& coordinate) {
  if (placements.size() != mesh_shape.size() || coordinate.size() != mesh_shape.size()) {
    throw UsageError("shard_box: mesh " + shape_to_string(mesh_shape) +
                     " needs one placement and one coordinate per mesh dimension, got " +
                     std::to_string(placements.size()) + " placements and coordinate " + shape_to_string(coordinate));
  }
  Box box{Shape(global_shape.size(), 0), global_shape};
  for (std::size_t m = 0; m < mesh_shape.size(); ++m) {
    if (mesh_shape[m] <= 0 || coordinate[m] < 0 || coordinate[m] >= mesh_shape[m]) {
      throw UsageError("shard_box: coordinate " + shape_to_string(coordinate) + " is outside mesh " +
                       shape_to_string(mesh_shape));
    }
    if (placements[m].kind != Placement::Kind::kShard) continue;
    int d = placements[m].dim;
    if (d < 0 || static_cast<std::size_t>(d) >= global_shape.size()) {
      throw UsageError("shard_box: Shard(" + std::to_string(d) + ") on a tensor of shape " +
                       shape_to_string(global_shape));
    }
    // Split the current piece of dim d (ceil division), as DTensor's Shard does.
    std::int64_t n = box.sizes[d];
    std::int64_t chunk = (n + mesh_shape[m] - 1) / mesh_shape[m];
    std::int64_t begin = std::min(coordinate[m] * chunk, n);
    std::int64_t end = std::min(begin + chunk, n);
    box.offsets[d] += begin;
    box.sizes[d] = end - begin;
  }
  return box;
}

std::vector<std::pair<Shape, Shape>> shard_boxes(const Shape& global_shape, const Shape& mesh_shape,
                                                 const std::vector<Placement>& placements) {
  std::vector<std::pair<Shape, Shape>> out;
  if (volume(mesh_shape) <= 0) throw UsageError("shard_boxes: empty mesh " + shape_to_string(mesh_shape));
  Shape coordinate(mesh_shape.size(), 0);
  while (true) {
    Box box = shard_box(global_shape, mesh_shape, placements, coordinate);
    out.emplace_back(std::move(box.offsets), std::move(box.sizes));
    // Next coordinate, last mesh dimension fastest.
    std::size_t m = mesh_shape.size();
    while (m > 0 && ++coordinate[m - 1] == mesh_shape[m - 1]) {
      coordinate[m - 1] = 0;
      --m;
    }
    if (m == 0) break;
  }
  return out;
}

BoxCursor::BoxCursor(const Shape& shape, std::size_t itemsize, std::uint64_t max_bytes) : shape_(shape) {
  if (shape.empty()) {
    scalar_bytes_ = itemsize;
    return;
  }
  for (auto d : shape) {
    if (d == 0) done_ = true;  // no elements: no boxes
  }
  if (done_) return;
  const std::size_t rank = shape.size();
  std::vector<std::uint64_t> tail(rank + 1);  // bytes of one index of dims [0, k)
  tail[rank] = itemsize;
  for (std::size_t k = rank; k-- > 0;) tail[k] = tail[k + 1] * static_cast<std::uint64_t>(shape[k]);
  while (d_ + 1 < rank && tail[d_ + 1] > max_bytes) ++d_;
  row_ = tail[d_ + 1];
  block_ = static_cast<std::int64_t>(std::max<std::uint64_t>(1, max_bytes / row_));
  offsets_.assign(rank, 0);
  sizes_ = shape;
  for (std::size_t k = 0; k < d_; ++k) sizes_[k] = 1;
}

bool BoxCursor::next(Shape& offsets, Shape& sizes, std::uint64_t& n) {
  if (done_) return false;
  if (shape_.empty()) {
    offsets.clear();
    sizes.clear();
    n = scalar_bytes_;
    done_ = true;
    return true;
  }
  offsets_[d_] = start_;
  sizes_[d_] = std::min(block_, shape_[d_] - start_);
  offsets = offsets_;
  sizes = sizes_;
  n = row_ * static_cast<std::uint64_t>(sizes_[d_]);
  start_ += block_;
  if (start_ >= shape_[d_]) {
    start_ = 0;
    offsets_[d_] = 0;
    done_ = true;  // unless the odometer over dims [0, d_) moves on
    for (std::size_t k = d_; k > 0;) {
      --k;
      if (++offsets_[k] < shape_[k]) {
        done_ = false;
        break;
      }
      offsets_[k] = 0;
    }
  }
  return true;
}

void for_each_box(const Shape& shape, std::size_t itemsize, std::uint64_t max_bytes,
                  const std::function<void(const Shape&, const Shape&, std::uint64_t)>& fn) {
  BoxCursor cursor(shape, itemsize, max_bytes);
  Shape offsets, sizes;
  std::uint64_t n = 0;
  while (cursor.next(offsets, sizes, n)) fn(offsets, sizes, n);
}

}  // namespace shardpoint::engine
