#include "engine/save_plan.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>

#include "engine/chunking.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

// Small tensors a rank's first file takes before they are spread like the others: half an
// object store's read window (8 MiB), so a load reads them in one GET; a state made only of
// small shards (many ranks) still writes all its files. On s3s-fs, 4 ranks loading 0.34 GB
// saved as 4 objects per rank sent 27 HEADs and 60 GETs with it, 54 and 86 without.
constexpr std::uint64_t kSmallTensorsInFirstFile = std::uint64_t{4} << 20;

std::string quoted(const std::string& s) { return '"' + s + '"'; }

std::string ranks_to_string(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

// "float32 on ranks 0, 1; bfloat16 on rank 2": which rank holds which value.
template <typename T, typename Print>
std::string disagreement(const std::vector<std::pair<T, int>>& seen, Print print) {
  std::vector<std::pair<T, std::vector<int>>> groups;
  for (const auto& [value, rank] : seen) {
    const T& v = value;  // clang 14 cannot capture a structured binding
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) {
      groups.push_back({value, {rank}});
    } else if (it->second.back() != rank) {
      it->second.push_back(rank);
    }
  }
  if (groups.size() < 2) return {};
  std::string out;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (i > 0) out += "; ";
    out += print(groups[i].first) + " on " + ranks_to_string(groups[i].second);
  }
  return out;
}

void check_local_shard(const std::string& fqn, const TensorShard& shard) {
  auto fail = [&](const std::string& why) { throw UsageError("tensor " + quoted(fqn) + ": " + why); };
  const std::size_t ndim = shard.global_shape.size();
  if (shard.offsets.size() != ndim || shard.sizes.size() != ndim) {
    fail("box " + shape_to_string(shard.offsets) + " + " + shape_to_string(shard.sizes) +
         " does not match the dimensions of global shape " + shape_to_string(shard.global_shape));
  }
  for (std::size_t d = 0; d < ndim; ++d) {
    if (shard.global_shape[d] < 0 || shard.offsets[d] < 0 || shard.sizes[d] < 0 ||
        shard.offsets[d] + shard.sizes[d] > shard.global_shape[d]) {
      fail("box " + box_to_string(shard.offsets, shard.sizes) + " is outside global shape " +
           shape_to_string(shard.global_shape));
    }
  }
  const auto nbytes = static_cast<std::uint64_t>(volume(shard.sizes)) * dtype_itemsize(shard.dtype);
  if (shard.data.data() != nullptr && shard.data.size() != nbytes) {
    fail("data holds " + std::to_string(shard.data.size()) + " bytes, box " +
         box_to_string(shard.offsets, shard.sizes) + " of " + std::string(dtype_name(shard.dtype)) + " needs " +
         std::to_string(nbytes));
  }
}

WriteItem tensor_item(const std::string& fqn, const TensorShard& shard) {
  WriteItem item;
  item.index = format::MetadataIndex{fqn, shard.offsets, std::nullopt};
  item.type = WriteItemType::kTensor;
  item.dtype = shard.dtype;
  item.requires_grad = shard.requires_grad;
  item.global_size = shard.global_shape;
  item.chunk = format::ChunkStorageMetadata{shard.offsets, shard.sizes};
  item.nbytes = static_cast<std::uint64_t>(volume(shard.sizes)) * dtype_itemsize(shard.dtype);
  return item;
}

// What all ranks must agree on for one fqn.
struct FqnView {
  std::vector<std::pair<WriteItemType, int>> types;
  std::vector<std::pair<DType, int>> dtypes;
  std::vector<std::pair<Shape, int>> global_sizes;
  std::map<Shape, std::vector<std::pair<Shape, int>>> chunk_sizes_by_offset;
};

// 1. Every rank must describe an fqn the same way; collects one problem line per conflict.
void check_ranks_agree(const std::vector<SavePlan>& plans, std::vector<std::string>& problems) {
  std::map<std::string, FqnView> views;
  for (const SavePlan& plan : plans) {
    for (const WriteItem& item : plan.items) {
      FqnView& view = views[item.index.fqn];
      view.types.emplace_back(item.type, plan.rank);
      if (item.type != WriteItemType::kTensor) continue;
      view.dtypes.emplace_back(item.dtype, plan.rank);
      view.global_sizes.emplace_back(item.global_size, plan.rank);
      view.chunk_sizes_by_offset[item.chunk.offsets].emplace_back(item.chunk.sizes, plan.rank);
    }
  }
  for (const auto& [fqn, view] : views) {
    auto report = [&, &fqn = fqn](const std::string& what, const std::string& detail) {
      if (!detail.empty()) problems.push_back(quoted(fqn) + ": " + what + " differs across ranks: " + detail);
    };
    report("type", disagreement(view.types, [](WriteItemType t) {
             return std::string(t == WriteItemType::kTensor ? "tensor" : "bytes");
           }));
    report("dtype", disagreement(view.dtypes, [](DType t) { return std::string(dtype_name(t)); }));
    report("global size", disagreement(view.global_sizes, shape_to_string));
    for (const auto& [offsets, sizes] : view.chunk_sizes_by_offset) {
      report("size of the chunk at offsets " + shape_to_string(offsets), disagreement(sizes, shape_to_string));
    }
  }
  std::map<std::string, std::vector<std::pair<format::ObjectPath, int>>> paths;
  for (const SavePlan& plan : plans) {
    for (const auto& [fqn, path] : plan.planner_data) paths[fqn].emplace_back(path, plan.rank);
  }
  for (const auto& [fqn, seen] : paths) {
    std::string detail = disagreement(seen, path_to_string);
    if (!detail.empty()) problems.push_back(quoted(fqn) + ": planner_data path differs across ranks: " + detail);
  }
}

// 2. DCP's dedup_save_plans: walk the items in order of first appearance (rank order,
// then plan order); each goes to one of the ranks that have it, the others drop it.
std::vector<SavePlan> deduplicate(std::vector<SavePlan> plans, bool to_lowest_rank) {
  std::map<format::MetadataIndex, std::vector<int>> holders;
  std::vector<const WriteItem*> first_seen;
  for (const SavePlan& plan : plans) {
    for (const WriteItem& item : plan.items) {
      auto& ranks = holders[item.index];
      if (ranks.empty()) first_seen.push_back(&item);
      ranks.push_back(plan.rank);
    }
  }
  std::vector<std::uint64_t> accumulated(plans.size(), 0);
  std::map<format::MetadataIndex, int> writer;
  for (const WriteItem* item : first_seen) {
    const std::vector<int>& ranks = holders[item->index];
    int chosen = ranks.front();  // ranks are ascending; ties go to the lowest rank
    if (!to_lowest_rank) {
      for (int r : ranks) {
        if (accumulated[r] < accumulated[chosen]) chosen = r;
      }
    }
    accumulated[chosen] += item->storage_size();
    writer.emplace(item->index, chosen);
  }
  for (SavePlan& plan : plans) {
    std::erase_if(plan.items, [&](const WriteItem& item) { return writer.at(item.index) != plan.rank; });
  }
  return plans;
}

// 3. Metadata skeleton: chunks sorted by offsets; each item learns its chunk position.
format::Metadata build_metadata(std::vector<SavePlan>& plans) {
  format::Metadata metadata;
  std::map<std::string, std::vector<WriteItem*>> by_fqn;
  for (SavePlan& plan : plans) {
    for (WriteItem& item : plan.items) by_fqn[item.index.fqn].push_back(&item);
    for (const auto& [fqn, path] : plan.planner_data) metadata.planner_data.emplace(fqn, path);
  }
  for (auto& [fqn, items] : by_fqn) {
    if (items.front()->type == WriteItemType::kBytes) {
      metadata.state_dict_metadata.emplace(fqn, format::BytesStorageMetadata{});
      continue;
    }
    std::sort(items.begin(), items.end(),
              [](const WriteItem* a, const WriteItem* b) { return a->chunk.offsets < b->chunk.offsets; });
    format::TensorStorageMetadata tensor;
    tensor.properties.dtype = items.front()->dtype;
    tensor.properties.requires_grad = items.front()->requires_grad;
    tensor.size = items.front()->global_size;
    for (WriteItem* item : items) {
      item->index.index = static_cast<std::int64_t>(tensor.chunks.size());
      tensor.chunks.push_back(item->chunk);
    }
    metadata.state_dict_metadata.emplace(fqn, std::move(tensor));
  }
  return metadata;
}

// Sweep along the dimension with the most distinct chunk offsets (the sharded one): after
// sorting by it, only chunks starting before box i ends there can overlap box i. This keeps
// the test near linear for dim-0 and dim-1 sharding alike.
void report_overlaps(const std::string& fqn, std::vector<Box> boxes, std::vector<std::string>& problems) {
  if (boxes.size() < 2) return;
  const std::size_t ndim = boxes.front().offsets.size();
  std::size_t sweep = 0;
  std::size_t most_distinct = 0;
  for (std::size_t d = 0; d < ndim; ++d) {
    std::set<std::int64_t> distinct;
    for (const Box& b : boxes) distinct.insert(b.offsets[d]);
    if (distinct.size() > most_distinct) {
      most_distinct = distinct.size();
      sweep = d;
    }
  }
  if (ndim > 0) {
    std::stable_sort(boxes.begin(), boxes.end(),
                     [sweep](const Box& a, const Box& b) { return a.offsets[sweep] < b.offsets[sweep]; });
  }
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    for (std::size_t j = i + 1; j < boxes.size(); ++j) {
      if (ndim > 0 && boxes[j].offsets[sweep] >= boxes[i].offsets[sweep] + boxes[i].sizes[sweep]) break;
      if (!boxes_overlap(boxes[i], boxes[j])) continue;
      const Box& first = boxes[i].offsets < boxes[j].offsets ? boxes[i] : boxes[j];
      const Box& second = &first == &boxes[i] ? boxes[j] : boxes[i];
      problems.push_back(quoted(fqn) + ": chunk " + box_to_string(first.offsets, first.sizes) + " overlaps chunk " +
                         box_to_string(second.offsets, second.sizes));
    }
  }
}

// 4. DCP's _validate_global_plan: chunks inside the tensor, pairwise disjoint, and
// together exactly as large as the tensor.
void validate_chunks(const std::string& fqn, const format::TensorStorageMetadata& tensor,
                     std::vector<std::string>& problems) {
  const Shape& size = tensor.size;
  std::int64_t covered = 0;
  std::vector<Box> boxes;
  for (const format::ChunkStorageMetadata& chunk : tensor.chunks) {
    bool inside = chunk.offsets.size() == size.size() && chunk.sizes.size() == size.size();
    for (std::size_t d = 0; inside && d < size.size(); ++d) {
      inside = chunk.offsets[d] >= 0 && chunk.sizes[d] >= 0 && chunk.offsets[d] + chunk.sizes[d] <= size[d];
    }
    if (!inside) {
      problems.push_back(quoted(fqn) + ": chunk " + box_to_string(chunk.offsets, chunk.sizes) +
                         " is outside the tensor's size " + shape_to_string(size));
      continue;
    }
    covered += volume(chunk.sizes);
    boxes.push_back(Box{chunk.offsets, chunk.sizes});
  }
  report_overlaps(fqn, std::move(boxes), problems);
  if (!size.empty() && covered != volume(size)) {
    problems.push_back(quoted(fqn) + ": chunks hold " + std::to_string(covered) + " elements, the tensor's size " +
                       shape_to_string(size) + " has " + std::to_string(volume(size)));
  }
}

std::string file_name(int rank, std::size_t n) {
  return "__" + std::to_string(rank) + "_" + std::to_string(n) + ".distcp";
}

// 5. Buckets -> files (split_into_files), each item told its file and position.
void assign_files(SavePlan& plan, const SavePlanOptions& options) {
  std::vector<ItemWeight> weights;
  weights.reserve(plan.items.size());
  for (const WriteItem& item : plan.items) weights.push_back({item.type, item.nbytes});
  std::vector<WriteItem> items = std::move(plan.items);
  plan.items.clear();
  plan.files.clear();
  for (const std::vector<std::size_t>& file : split_into_files(weights, options)) {
    plan.files.push_back(file_name(plan.rank, plan.files.size()));
    for (std::size_t i = 0; i < file.size(); ++i) {
      WriteItem& item = items[file[i]];
      item.file = plan.files.back();
      item.index_in_file = static_cast<std::int64_t>(i);
      plan.items.push_back(std::move(item));
    }
  }
}

}  // namespace

std::uint64_t WriteItem::storage_size() const {
  std::uint64_t size = type == WriteItemType::kTensor ? nbytes : bytes_size.value_or(1);
  return std::max<std::uint64_t>(size, 1);
}

bool WriteItem::operator==(const WriteItem& o) const {
  return index == o.index && index.index == o.index.index && type == o.type && dtype == o.dtype &&
         requires_grad == o.requires_grad && global_size == o.global_size && chunk == o.chunk && nbytes == o.nbytes &&
         bytes_size == o.bytes_size && file == o.file && index_in_file == o.index_in_file;
}

std::string WriteItem::to_string() const {
  std::string out;
  if (type == WriteItemType::kTensor) {
    out = "tensor " + quoted(index.fqn) + " " + box_to_string(chunk.offsets, chunk.sizes) + " of " +
          std::string(dtype_name(dtype)) + shape_to_string(global_size) + " (" + std::to_string(nbytes) + " B)";
  } else {
    out = "bytes " + quoted(index.fqn);
    if (bytes_size) out += " (" + std::to_string(*bytes_size) + " B)";
  }
  if (index.index) out += " chunk #" + std::to_string(*index.index);
  if (!file.empty()) out += " -> " + file + "#" + std::to_string(index_in_file);
  return out;
}

std::string SavePlan::to_string() const {
  std::string out = "SavePlan rank " + std::to_string(rank) + " (" + std::to_string(items.size()) + " items)\n";
  for (const WriteItem& item : items) out += "  " + item.to_string() + "\n";
  return out;
}

SavePlan make_local_save_plan(const FlatStateDict& flat, int rank) {
  SavePlan plan;
  plan.rank = rank;
  plan.planner_data = flat.planner_data;
  for (const auto& [fqn, leaf] : flat.items) {
    if (const auto* shard = std::get_if<TensorShard>(&leaf)) {
      check_local_shard(fqn, *shard);
      plan.items.push_back(tensor_item(fqn, *shard));
    } else {
      WriteItem item;
      item.index = format::MetadataIndex{fqn, std::nullopt, std::nullopt};
      item.type = WriteItemType::kBytes;
      plan.items.push_back(std::move(item));
    }
  }
  return plan;
}

std::vector<std::vector<std::size_t>> split_into_files(std::span<const ItemWeight> items,
                                                       const SavePlanOptions& options) {
  if (options.thread_count < 1) throw UsageError("save plan: thread_count must be >= 1");
  std::vector<std::vector<std::size_t>> files;
  if (!options.single_file_per_rank) {
    for (std::size_t i = 0; i < items.size(); ++i) files.push_back({i});
    return files;
  }
  files.resize(static_cast<std::size_t>(options.thread_count));
  if (files.size() == 1) {
    files[0].resize(items.size());
    std::iota(files[0].begin(), files[0].end(), std::size_t{0});
  }
  // Bytes items and tensors under small_item_bytes go to the first file, the tensors up to
  // kSmallTensorsInFirstFile bytes in plan order; the other tensors by size descending
  // (stable) into the file with the fewest bytes so far (DCP's _split_by_size_and_type,
  // which deals bytes items round-robin instead). A load needs the small items of every
  // rank (the replicated ones dedup spread over the ranks), so it opens one file of each
  // other rank rather than all of them.
  std::vector<std::uint64_t> file_bytes(files.size(), 0);
  std::vector<std::size_t> tensors;
  for (std::size_t i = 0; i < items.size() && files.size() > 1; ++i) {
    if (items[i].type == WriteItemType::kBytes) {
      files[0].push_back(i);
    } else if (items[i].nbytes < options.small_item_bytes &&
               file_bytes[0] + items[i].nbytes <= kSmallTensorsInFirstFile) {
      files[0].push_back(i);
      file_bytes[0] += items[i].nbytes;
    } else {
      tensors.push_back(i);
    }
  }
  std::stable_sort(tensors.begin(), tensors.end(),
                   [&](std::size_t a, std::size_t b) { return items[a].nbytes > items[b].nbytes; });
  for (std::size_t i : tensors) {
    const auto smallest = std::min_element(file_bytes.begin(), file_bytes.end()) - file_bytes.begin();
    file_bytes[smallest] += items[i].nbytes;
    files[smallest].push_back(i);
  }
  // Each file in write order: bytes items first (DCP's writer), then tensors smaller than
  // small_item_bytes, then the rest; split order within each group. Small items so sit
  // next to each other at the file's start, and a rank that needs another rank's small
  // items (a replicated optimizer `step` dedup left there, a small shard of a reshard) reads
  // them in one ranged GET instead of one per item. DCP's readers find each blob by its
  // offset in `.metadata`, so the order inside a file is ours to choose.
  for (std::vector<std::size_t>& file : files) {
    auto tensors_begin = std::stable_partition(file.begin(), file.end(),
                                               [&](std::size_t i) { return items[i].type == WriteItemType::kBytes; });
    std::stable_partition(tensors_begin, file.end(),
                          [&](std::size_t i) { return items[i].nbytes < options.small_item_bytes; });
  }
  return files;
}

int files_per_rank(int thread_count, const storage::StorageFeatures& features) {
  return features.object_store ? std::max(thread_count, kObjectStoreFilesPerRank) : thread_count;
}

GlobalSavePlan make_global_save_plan(std::vector<SavePlan> local_plans, const SavePlanOptions& options) {
  if (options.thread_count < 1) {
    throw UsageError("thread_count must be >= 1, got " + std::to_string(options.thread_count));
  }
  for (std::size_t i = 0; i < local_plans.size(); ++i) {
    if (local_plans[i].rank != static_cast<int>(i)) {
      throw UsageError("local plan #" + std::to_string(i) + " says rank " + std::to_string(local_plans[i].rank) +
                       "; plans must be gathered in rank order");
    }
  }
  std::vector<std::string> problems;
  check_ranks_agree(local_plans, problems);
  if (problems.empty()) {
    local_plans = deduplicate(std::move(local_plans), options.dedup_to_lowest_rank);
  }
  GlobalSavePlan global;
  if (problems.empty()) {
    global.metadata = build_metadata(local_plans);
    for (const auto& [fqn, storage] : global.metadata.state_dict_metadata) {
      if (const auto* tensor = std::get_if<format::TensorStorageMetadata>(&storage)) {
        validate_chunks(fqn, *tensor, problems);
      }
    }
  }
  if (!problems.empty()) {
    std::string message = "invalid global save plan (" + std::to_string(problems.size()) + " problem" +
                          (problems.size() == 1 ? "" : "s") + "):";
    for (const std::string& p : problems) message += "\n  " + p;
    throw PlanError(message);
  }
  for (SavePlan& plan : local_plans) assign_files(plan, options);
  global.plans = std::move(local_plans);
  return global;
}

std::map<format::MetadataIndex, format::StorageInfo> storage_layout(const SavePlan& plan,
                                                                    std::span<const std::uint64_t> blob_lengths) {
  if (blob_lengths.size() != plan.items.size()) {
    throw UsageError("storage_layout: rank " + std::to_string(plan.rank) + " has " + std::to_string(plan.items.size()) +
                     " items but " + std::to_string(blob_lengths.size()) + " blob lengths");
  }
  // Items of one file in write order, then running offsets.
  std::map<std::string, std::map<std::int64_t, std::size_t>> files;
  for (std::size_t i = 0; i < plan.items.size(); ++i) {
    const WriteItem& item = plan.items[i];
    if (item.file.empty()) throw UsageError("storage_layout: item " + item.to_string() + " has no file");
    if (!files[item.file].emplace(item.index_in_file, i).second) {
      throw UsageError("storage_layout: two items at position " + std::to_string(item.index_in_file) + " of " +
                       item.file);
    }
  }
  std::map<format::MetadataIndex, format::StorageInfo> layout;
  for (const auto& [file, in_order] : files) {
    std::uint64_t offset = 0;
    for (const auto& [position, i] : in_order) {
      layout.emplace(plan.items[i].index, format::StorageInfo{file, offset, blob_lengths[i], {}});
      offset += blob_lengths[i];
    }
  }
  return layout;
}

}  // namespace shardpoint::engine
