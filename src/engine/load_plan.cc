#include "engine/load_plan.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "engine/chunking.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

std::string quoted(const std::string& s) { return '"' + s + '"'; }

std::string describe_tensor(DType dtype, const Shape& size) {
  return std::string(dtype_name(dtype)) + shape_to_string(size);
}

std::string describe_saved(const format::StorageMetadata& storage) {
  if (const auto* tensor = std::get_if<format::TensorStorageMetadata>(&storage)) {
    return "tensor " + describe_tensor(tensor->properties.dtype, tensor->size);
  }
  return "bytes";
}

std::string describe_requested(const FlatValue& leaf) {
  if (const auto* shard = std::get_if<TensorShard>(&leaf)) {
    return "tensor " + describe_tensor(shard->dtype, shard->global_shape);
  }
  return "bytes";
}

void check_requested_box(const std::string& fqn, const TensorShard& shard) {
  bool ok = shard.offsets.size() == shard.global_shape.size() && shard.sizes.size() == shard.global_shape.size();
  for (std::size_t d = 0; ok && d < shard.sizes.size(); ++d) {
    ok = shard.offsets[d] >= 0 && shard.sizes[d] >= 0 && shard.offsets[d] + shard.sizes[d] <= shard.global_shape[d];
  }
  if (!ok) {
    throw UsageError("requested tensor " + quoted(fqn) + ": box " + shape_to_string(shard.offsets) + " + " +
                     shape_to_string(shard.sizes) + " is not inside its global shape " +
                     shape_to_string(shard.global_shape));
  }
}

// ReadItems for one requested box against the saved chunks (visited in offsets order).
// Returns the number of requested elements the chunks supply.
std::int64_t plan_tensor_reads(const std::string& fqn, const TensorShard& shard,
                               const format::TensorStorageMetadata& saved, std::vector<ReadItem>& out) {
  std::vector<std::size_t> order(saved.chunks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return saved.chunks[a].offsets < saved.chunks[b].offsets; });
  const Box local{shard.offsets, shard.sizes};
  std::int64_t supplied = 0;
  for (std::size_t position : order) {
    const format::ChunkStorageMetadata& chunk = saved.chunks[position];
    if (chunk.offsets.size() != local.offsets.size() || chunk.sizes.size() != local.sizes.size()) continue;
    const Box stored{chunk.offsets, chunk.sizes};
    if (!boxes_overlap(local, stored)) continue;
    Box common = intersect(local, stored);
    if (volume(common.sizes) == 0) continue;
    ReadItem item;
    item.type = ReadItemType::kTensor;
    item.dest_index = format::MetadataIndex{fqn, local.offsets, 0};
    item.storage_index = format::MetadataIndex{fqn, chunk.offsets, static_cast<std::int64_t>(position)};
    for (std::size_t d = 0; d < common.sizes.size(); ++d) {
      item.dest_offsets.push_back(common.offsets[d] - local.offsets[d]);
      item.storage_offsets.push_back(common.offsets[d] - stored.offsets[d]);
    }
    item.lengths = common.sizes;
    supplied += volume(common.sizes);
    out.push_back(std::move(item));
  }
  return supplied;
}

// Row-major byte runs of the box [offsets, offsets + lengths) inside an array of `sizes`.
std::vector<ByteRange> row_major_runs(const Shape& offsets, const Shape& lengths, const Shape& sizes,
                                      std::size_t itemsize, const char* what) {
  const std::size_t ndim = sizes.size();
  bool fits = offsets.size() == ndim && lengths.size() == ndim;
  for (std::size_t d = 0; fits && d < ndim; ++d) {
    fits = offsets[d] >= 0 && lengths[d] >= 0 && offsets[d] + lengths[d] <= sizes[d];
  }
  if (!fits) {
    throw UsageError(std::string(what) + ": box at " + shape_to_string(offsets) + " of lengths " +
                     shape_to_string(lengths) + " is not inside " + shape_to_string(sizes));
  }
  if (volume(lengths) == 0) return {};
  if (ndim == 0) return {ByteRange{0, itemsize}};
  // strides[d]: elements between neighbours along dimension d.
  Shape strides(ndim, 1);
  for (std::size_t d = ndim - 1; d > 0; --d) strides[d - 1] = strides[d] * sizes[d];
  // Dimensions after `inner` are copied whole, so one run spans lengths[inner] of them.
  std::size_t inner = ndim - 1;
  while (inner > 0 && lengths[inner] == sizes[inner]) --inner;
  const auto run_bytes = static_cast<std::uint64_t>(lengths[inner] * strides[inner]) * itemsize;

  std::vector<ByteRange> runs;
  Shape index(inner, 0);  // position among the runs, over dimensions [0, inner)
  while (true) {
    std::int64_t start = offsets[inner] * strides[inner];
    for (std::size_t d = 0; d < inner; ++d) start += (offsets[d] + index[d]) * strides[d];
    const auto begin = static_cast<std::uint64_t>(start) * itemsize;
    if (!runs.empty() && runs.back().offset + runs.back().length == begin) {
      runs.back().length += run_bytes;
    } else {
      runs.push_back(ByteRange{begin, run_bytes});
    }
    std::size_t d = inner;
    while (d > 0 && ++index[d - 1] == lengths[d - 1]) {
      index[d - 1] = 0;
      --d;
    }
    if (d == 0) break;
  }
  return runs;
}

const char* kind_label(LoadProblem::Kind kind) {
  switch (kind) {
    case LoadProblem::Kind::kMissingKey: return "missing from the checkpoint";
    case LoadProblem::Kind::kUnexpectedKey: return "in the checkpoint but not requested";
    case LoadProblem::Kind::kTypeMismatch: return "type mismatch";
    case LoadProblem::Kind::kDTypeMismatch: return "dtype mismatch";
    case LoadProblem::Kind::kShapeMismatch: return "global shape mismatch";
    case LoadProblem::Kind::kIncompleteCoverage: return "saved chunks do not cover the request exactly once";
  }
  return "?";
}

bool is_error(const LoadProblem& problem, const LoadPlanOptions& options) {
  return problem.kind != LoadProblem::Kind::kUnexpectedKey || options.unexpected_keys_are_errors;
}

}  // namespace

bool ReadItem::operator==(const ReadItem& o) const {
  return type == o.type && dest_index == o.dest_index && dest_index.index == o.dest_index.index &&
         dest_offsets == o.dest_offsets && storage_index == o.storage_index &&
         storage_index.index == o.storage_index.index && storage_offsets == o.storage_offsets && lengths == o.lengths;
}

std::string ReadItem::to_string() const {
  if (type == ReadItemType::kBytes) return "bytes " + quoted(dest_index.fqn);
  std::string out = "tensor " + quoted(dest_index.fqn) + " " + box_to_string(dest_offsets, lengths) + " <- chunk";
  if (storage_index.index) out += " #" + std::to_string(*storage_index.index);
  out +=
      " at " + shape_to_string(storage_index.offset.value_or(Shape{})) + " " + box_to_string(storage_offsets, lengths);
  return out;
}

std::string LoadProblem::to_string() const {
  return quoted(fqn) + ": " + kind_label(kind) + ": expected " + expected + ", found " + found;
}

std::string LoadPlan::to_string() const {
  std::string out =
      "LoadPlan (" + std::to_string(items.size()) + " reads, " + std::to_string(problems.size()) + " problems)\n";
  for (const ReadItem& item : items) out += "  " + item.to_string() + "\n";
  for (const LoadProblem& problem : problems) out += "  problem: " + problem.to_string() + "\n";
  return out;
}

LoadPlan make_load_plan(const format::Metadata& metadata, const FlatStateDict& requested,
                        const LoadPlanOptions& options) {
  LoadPlan plan;
  auto problem = [&](LoadProblem::Kind kind, const std::string& fqn, std::string expected, std::string found) {
    plan.problems.push_back(LoadProblem{kind, fqn, std::move(expected), std::move(found)});
  };
  for (const auto& [fqn, leaf] : requested.items) {
    const auto* shard = std::get_if<TensorShard>(&leaf);
    if (shard != nullptr) check_requested_box(fqn, *shard);
    auto saved = metadata.state_dict_metadata.find(fqn);
    if (saved == metadata.state_dict_metadata.end()) {
      problem(LoadProblem::Kind::kMissingKey, fqn, describe_requested(leaf), "nothing");
      continue;
    }
    const auto* tensor = std::get_if<format::TensorStorageMetadata>(&saved->second);
    if ((shard != nullptr) != (tensor != nullptr)) {
      problem(LoadProblem::Kind::kTypeMismatch, fqn, describe_requested(leaf), describe_saved(saved->second));
      continue;
    }
    if (shard == nullptr) {
      ReadItem item;
      item.type = ReadItemType::kBytes;
      item.dest_index = format::MetadataIndex{fqn, std::nullopt, std::nullopt};
      item.storage_index = format::MetadataIndex{fqn, std::nullopt, std::nullopt};
      plan.items.push_back(std::move(item));
      continue;
    }
    bool mismatch = false;
    if (shard->dtype != tensor->properties.dtype) {
      problem(LoadProblem::Kind::kDTypeMismatch, fqn, std::string(dtype_name(shard->dtype)),
              std::string(dtype_name(tensor->properties.dtype)));
      mismatch = true;
    }
    if (shard->global_shape != tensor->size) {
      problem(LoadProblem::Kind::kShapeMismatch, fqn, shape_to_string(shard->global_shape),
              shape_to_string(tensor->size));
      mismatch = true;
    }
    if (mismatch) continue;
    std::vector<ReadItem> reads;
    std::int64_t supplied = plan_tensor_reads(fqn, *shard, *tensor, reads);
    if (supplied != volume(shard->sizes)) {
      problem(LoadProblem::Kind::kIncompleteCoverage, fqn,
              std::to_string(volume(shard->sizes)) + " elements for box " + box_to_string(shard->offsets, shard->sizes),
              std::to_string(supplied));
      continue;
    }
    for (ReadItem& item : reads) plan.items.push_back(std::move(item));
  }
  for (const auto& [fqn, storage] : metadata.state_dict_metadata) {
    if (!requested.items.contains(fqn)) {
      problem(LoadProblem::Kind::kUnexpectedKey, fqn, "nothing", describe_saved(storage));
    }
  }
  std::stable_sort(plan.problems.begin(), plan.problems.end(), [](const LoadProblem& a, const LoadProblem& b) {
    return std::tie(a.fqn, a.kind) < std::tie(b.fqn, b.kind);
  });
  if (options.strict) {
    std::vector<const LoadProblem*> errors;
    for (const LoadProblem& p : plan.problems) {
      if (is_error(p, options)) errors.push_back(&p);
    }
    if (!errors.empty()) {
      std::string message = "checkpoint cannot satisfy the load request (" + std::to_string(errors.size()) +
                            " problem" + (errors.size() == 1 ? "" : "s") + "):";
      for (const LoadProblem* p : errors) message += "\n  " + p->to_string();
      throw PlanError(message);
    }
  }
  return plan;
}

FlatStateDict flatten_for_load(const format::Metadata& metadata, const StateNode& root) {
  FlatStateDict flat = flatten_state_dict(root, FlattenRule::kDcp24);
  std::set<std::string> unrequested;
  for (const auto& [fqn, storage] : metadata.state_dict_metadata) {
    if (!flat.items.contains(fqn)) unrequested.insert(fqn);
  }
  if (unrequested.empty()) return flat;
  // DCP 2.5+: keys only the 2.3 rule produces mean a 2.3-era checkpoint.
  FlatStateDict old = flatten_state_dict(root, FlattenRule::kDcp23);
  for (const auto& [fqn, leaf] : old.items) {
    if (unrequested.contains(fqn)) return old;
  }
  return flat;
}

std::vector<ByteRange> saved_chunk_byte_ranges(const ReadItem& item, const Shape& saved_chunk_sizes,
                                               std::size_t itemsize) {
  if (item.type == ReadItemType::kBytes) return {};
  return row_major_runs(item.storage_offsets, item.lengths, saved_chunk_sizes, itemsize, "saved chunk byte ranges");
}

std::vector<ByteRange> dest_byte_ranges(const ReadItem& item, const Shape& dest_box_sizes, std::size_t itemsize) {
  if (item.type == ReadItemType::kBytes) return {};
  return row_major_runs(item.dest_offsets, item.lengths, dest_box_sizes, itemsize, "destination byte ranges");
}

}  // namespace shardpoint::engine
