#include "shardpoint/reshard.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/checkpoint_location.h"
#include "engine/chunking.h"
#include "engine/flatten.h"
#include "engine/item_writer.h"
#include "engine/lightning_meta.h"
#include "engine/parallel_for.h"
#include "engine/save_plan.h"
#include "engine/save_steps.h"
#include "engine/torch_file_crc.h"
#include "pickle/repr.h"
#include "pickle/tree_edit.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/storage_registry.h"
#include "torchfile/tree_storages.h"

namespace shardpoint::engine {
namespace {

using pickle::Kind;
using pickle::Value;

constexpr std::uint64_t kMinSlabBytes = std::uint64_t{64} << 10;

// One leaf of the source in DCP flattening order.
struct SourceLeaf {
  std::string fqn;
  ObjectPath path;
  bool is_tensor = false;
  DType dtype = DType::kFloat32;
  Shape shape;
  bool requires_grad = false;
  bool replicated = false;  // written whole once
  pickle::ValuePtr object;  // objects (read at open)
  // An object that holds tensors: the archive whose records hold their storages (the bytes
  // item itself, or the torch.save source file); null for other objects.
  std::shared_ptr<const torchfile::TorchFile> object_archive;
};

std::uint64_t element_count(const Shape& shape) {
  std::uint64_t n = 1;
  for (auto s : shape) n *= static_cast<std::uint64_t>(s);
  return n;
}

std::uint64_t leaf_bytes(const SourceLeaf& leaf) { return element_count(leaf.shape) * dtype_itemsize(leaf.dtype); }

// A checkpoint read box by box. read_box() is thread-safe.
class ReshardSource {
 public:
  virtual ~ReshardSource() = default;
  virtual CheckpointKind format() const = 0;
  // The zip CRC-32 checks of the reads so far.
  virtual ZipCrcCounts zip_crc_counts() const { return {}; }
  // The source folder's Lightning meta.pt (engine/lightning_meta.h), read and checked
  // whole; nullopt when it has none or is not a folder.
  virtual std::optional<LightningMeta> lightning_meta(bool /*check_crc*/) { return std::nullopt; }
  const std::vector<SourceLeaf>& leaves() const { return leaves_; }
  // Copies the box [offsets, offsets + sizes) of tensor leaf i into dest (row-major).
  // REQUIRES the box is contiguous in the tensor's row-major order (a run of whole rows, or
  // part of one row on the dimensions for_each_box splits): every box reshard reads is.
  virtual void read_box(std::size_t i, const Shape& offsets, const Shape& sizes, std::span<std::byte> dest) = 0;

 protected:
  std::vector<SourceLeaf> leaves_;
};

class DcpSource final : public ReshardSource {
 public:
  DcpSource(std::shared_ptr<storage::Storage> storage, CheckpointKind kind, const ReshardOptions& options)
      : storage_(std::move(storage)),
        kind_(kind),
        reader_(*storage_, CheckpointReaderOptions{.verify_checksums = options.verify_checksums,
                                                   .check_zip_crc = options.check_zip_crc}) {
    const format::Metadata& md = reader_.metadata();
    bool sharded = false;
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      if (const auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) sharded |= t->chunks.size() > 1;
    }
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      SourceLeaf leaf;
      leaf.fqn = fqn;
      auto p = md.planner_data.find(fqn);
      leaf.path = p != md.planner_data.end() ? p->second : ObjectPath{fqn};
      if (const auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) {
        leaf.is_tensor = true;
        leaf.dtype = t->properties.dtype;
        leaf.shape = t->size;
        leaf.requires_grad = t->properties.requires_grad;
        leaf.replicated = leaf.shape.empty() || (sharded && t->chunks.size() == 1 && t->chunks[0].sizes == t->size &&
                                                 std::all_of(t->chunks[0].offsets.begin(), t->chunks[0].offsets.end(),
                                                             [](std::int64_t o) { return o == 0; }));
      } else {
        std::shared_ptr<const torchfile::TorchFile> item = reader_.read_object_file(fqn);
        leaf.object = item->root();
        if (leaf.object && pickle::holds_persistent_id(*leaf.object)) leaf.object_archive = std::move(item);
      }
      leaves_.push_back(std::move(leaf));
    }
  }

  CheckpointKind format() const override { return kind_; }
  ZipCrcCounts zip_crc_counts() const override { return reader_.zip_crc_counts(); }
  std::optional<LightningMeta> lightning_meta(bool check_crc) override {
    return read_lightning_meta(*storage_, check_crc);
  }

  void read_box(std::size_t i, const Shape& offsets, const Shape& sizes, std::span<std::byte> dest) override {
    reader_.read_box(leaves_[i].fqn, offsets, sizes, dest);
  }

 private:
  std::shared_ptr<storage::Storage> storage_;
  CheckpointKind kind_;  // kDcp or kHfSafetensors
  CheckpointReader reader_;
};

// A torch.save file walked as `inspect` walks it (DCP >= 2.4 flattening; tuples holding
// tensors are descended like lists), read with pread / ranged reads. With check_zip_crc
// the CRC-32 of every record read is checked (torch_file_crc.h): the small records at
// open, the storages of objects that hold tensors at open (whole: torchfile copies them
// without a hook), the tensors' storage records as their boxes are read.
class TorchSource final : public ReshardSource {
 public:
  TorchSource(const CheckpointLocation& location, bool check_zip_crc)
      : name_(location.name),
        file_(open_torch_file_naming_crc([&] { return open_torch_source(location); }, location.name, check_zip_crc)) {
    if (check_zip_crc) {
      crc_ = std::make_unique<TorchFileCrc>(*file_, name_);
      crc_->check_small_records();
    }
    const Value& root = *file_->root();
    if (!is_mapping(root)) {
      throw FormatError(name_ + ": the root object is " + pickle::repr(root).substr(0, 60) +
                        ", not a mapping; a DCP checkpoint needs a state dict");
    }
    walk(file_->root(), {}, 0);
  }

  CheckpointKind format() const override { return CheckpointKind::kTorchSave; }
  ZipCrcCounts zip_crc_counts() const override { return crc_ ? crc_->counts() : ZipCrcCounts{}; }

  void read_box(std::size_t i, const Shape& offsets, const Shape& sizes, std::span<std::byte> dest) override {
    const torchfile::TensorInfo& info = *infos_[i];
    // Element runs of a strided tensor are too small to check one by one: its storage
    // record is checked whole, once.
    if (crc_ && !info.is_contiguous()) crc_->check_storage(info, leaves_[i].fqn);
    const std::uint64_t itemsize = dtype_itemsize(info.dtype);
    // The box as a run of elements of the row-major tensor.
    std::uint64_t first = 0, stride = 1;
    for (std::size_t d = info.shape.size(); d-- > 0;) {
      first += static_cast<std::uint64_t>(offsets[d]) * stride;
      stride *= static_cast<std::uint64_t>(info.shape[d]);
    }
    const std::uint64_t count = element_count(sizes);
    const std::string what = "tensor \"" + leaves_[i].fqn + "\"";
    if (!info.big_endian && info.is_contiguous()) {
      const std::uint64_t at = static_cast<std::uint64_t>(info.storage_offset) + first;
      read(i, info.storage.offset + at * itemsize, dest.first(count * itemsize), what);
      return;
    }
    // Strided or big-endian: the tensor's byte runs in row-major order, the part of
    // [first, first + count) of each copied.
    const std::uint64_t begin = first * itemsize, end = (first + count) * itemsize;
    std::uint64_t pos = 0;  // row-major byte position of the run
    torchfile::for_each_run(info, [&](std::uint64_t offset, std::uint64_t n) {
      const std::uint64_t lo = std::max(pos, begin), hi = std::min(pos + n, end);
      if (lo < hi) read(i, offset + (lo - pos), dest.subspan(lo - begin, hi - lo), what);
      pos += n;
    });
    if (info.big_endian) {
      std::size_t width = itemsize;
      if (info.dtype == DType::kComplex32 || info.dtype == DType::kComplex64 || info.dtype == DType::kComplex128) {
        width /= 2;
      }
      for (std::size_t k = 0; width > 1 && k + width <= end - begin; k += width) {
        std::reverse(dest.begin() + k, dest.begin() + k + width);
      }
    }
  }

 private:
  static constexpr int kMaxDepth = 1000;

  // Reads bytes of tensor leaf i as stored; a contiguous tensor's reads are pieces of its
  // storage record's CRC-32.
  void read(std::size_t i, std::uint64_t at, std::span<std::byte> out, const std::string& what) {
    if (crc_ && infos_[i]->is_contiguous()) {
      crc_->read(*infos_[i], leaves_[i].fqn, at, out, what);
    } else {
      file_->source().read(at, out, what);
    }
  }

  // Checks the storages an object leaf's tree references (write_object_with_storages
  // copies them whole).
  void check_object_storages(const pickle::ValuePtr& object, const std::string& fqn) {
    pickle::ValuePtr root = object;
    pickle::replace_nodes(root, [&](const pickle::ValuePtr& node) -> pickle::ValuePtr {
      if (node->is(Kind::kPersistentId)) {
        crc_->check_storage(torchfile::parse_storage_pid(*node, name_).key, "object \"" + fqn + "\"");
      }
      return nullptr;
    });
  }

  static bool is_mapping(const Value& v) {
    if (v.is(Kind::kDict)) return true;
    return v.is(Kind::kObject) && !v.entries().empty() && v.items().empty();
  }

  bool holds_tensor_or_mapping(const Value& v, int depth) const {
    if (depth > kMaxDepth) return false;
    if (file_->tensor_of(v) != nullptr || is_mapping(v)) return true;
    if (v.is(Kind::kList) || v.is(Kind::kTuple)) {
      for (const auto& item : v.items()) {
        if (item && holds_tensor_or_mapping(*item, depth + 1)) return true;
      }
    }
    return false;
  }

  void walk(const pickle::ValuePtr& node, const ObjectPath& path, int depth) {
    const Value& v = *node;
    if (depth > kMaxDepth) throw FormatError(name_ + ": nesting deeper than " + std::to_string(kMaxDepth));
    if (const torchfile::TensorInfo* t = file_->tensor_of(v)) {
      SourceLeaf leaf;
      leaf.fqn = path_to_fqn(path);
      leaf.path = path;
      leaf.is_tensor = true;
      leaf.dtype = t->dtype;
      leaf.shape = t->shape;
      leaf.requires_grad = t->requires_grad;
      leaf.replicated = t->shape.empty();
      infos_.push_back(t);
      leaves_.push_back(std::move(leaf));
      return;
    }
    if (is_mapping(v)) {
      for (const auto& [k, child] : v.entries()) {
        ObjectPath sub = path;
        sub.emplace_back(k->is(Kind::kStr) ? k->as_string() : pickle::repr(*k));
        walk(child, sub, depth + 1);
      }
      return;
    }
    if ((v.is(Kind::kList) || v.is(Kind::kTuple)) && holds_tensor_or_mapping(v, depth)) {
      for (std::size_t i = 0; i < v.items().size(); ++i) {
        ObjectPath sub = path;
        sub.emplace_back(static_cast<std::int64_t>(i));
        walk(v.items()[i], sub, depth + 1);
      }
      return;
    }
    SourceLeaf leaf;
    leaf.fqn = path_to_fqn(path);
    leaf.path = path;
    // Shares the node of the file's tree; the TorchFile outlives the writes.
    leaf.object = node;
    if (pickle::holds_persistent_id(v)) {
      leaf.object_archive = file_;
      if (crc_) check_object_storages(node, leaf.fqn);
    }
    infos_.push_back(nullptr);
    leaves_.push_back(std::move(leaf));
  }

  std::string name_;
  std::shared_ptr<const torchfile::TorchFile> file_;
  std::unique_ptr<TorchFileCrc> crc_;                // null without check_zip_crc
  std::vector<const torchfile::TensorInfo*> infos_;  // per leaf; nullptr for objects
};

// Runs fn; an Error whose message names only a file inside the source (CheckpointReader's
// "__1_0.distcp: item ...") gets the source's path or URL in front, keeping its type.
template <typename Fn>
auto naming_source(const std::string& name, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    if (std::string_view(e.what()).find(name) != std::string_view::npos) throw;
    rethrow_with_context(name);
  }
}

std::unique_ptr<ReshardSource> open_source(const Location& where, const ReshardOptions& options) {
  return naming_source(where.text(), [&]() -> std::unique_ptr<ReshardSource> {
    CheckpointLocation location = locate_checkpoint(where);
    if (location.is_folder()) return std::make_unique<DcpSource>(location.storage, location.kind, options);
    return std::make_unique<TorchSource>(location, options.verify_checksums && options.check_zip_crc);
  });
}

// Step 2: one rank's leaves as save() flattens them (tensor shards without data: planning
// never reads data).
FlatStateDict rank_leaves(const std::vector<SourceLeaf>& leaves, int rank, int ranks) {
  FlatStateDict flat;
  for (const SourceLeaf& leaf : leaves) {
    flat.planner_data[leaf.fqn] = leaf.path;
    if (!leaf.is_tensor) {
      flat.items[leaf.fqn] = leaf.object;
      continue;
    }
    TensorShard shard;
    shard.dtype = leaf.dtype;
    shard.global_shape = leaf.shape;
    shard.requires_grad = leaf.requires_grad;
    if (leaf.replicated) {
      shard.offsets.assign(leaf.shape.size(), 0);
      shard.sizes = leaf.shape;
    } else {
      Box box = shard_box(leaf.shape, {ranks}, {Placement::shard(0)}, {rank});
      shard.offsets = box.offsets;
      shard.sizes = box.sizes;
    }
    flat.items[leaf.fqn] = std::move(shard);
  }
  // The round trip save() makes of its state tree, so keys and paths are what it plans on.
  return flatten_state_dict(unflatten_state_dict(flat));
}

// One file of one rank, with its items in write order.
struct FileTask {
  int rank = 0;
  std::string file;
  std::vector<const WriteItem*> items;
};

std::vector<FileTask> file_tasks(const GlobalSavePlan& global) {
  std::vector<FileTask> tasks;
  for (const SavePlan& plan : global.plans) {
    std::map<std::string, std::size_t> by_file;
    for (const std::string& file : plan.files) {
      by_file[file] = tasks.size();
      tasks.push_back(FileTask{plan.rank, file, {}});
    }
    for (const WriteItem& item : plan.items) {
      auto it = by_file.find(item.file);
      if (it == by_file.end()) {
        throw Error("reshard: item \"" + item.index.fqn + "\" is planned into \"" + item.file +
                    "\", not a file of rank " + std::to_string(plan.rank) + " (internal error)");
      }
      tasks[it->second].items.push_back(&item);
    }
  }
  for (FileTask& task : tasks) {
    std::sort(task.items.begin(), task.items.end(),
              [](const WriteItem* a, const WriteItem* b) { return a->index_in_file < b->index_in_file; });
  }
  return tasks;
}

}  // namespace

ReshardReport reshard(const std::string& source, storage::Storage& destination, const ReshardOptions& options) {
  return reshard(Location::parse(source), destination, options);
}

ReshardReport reshard(const Location& source_location, storage::Storage& destination, const ReshardOptions& options) {
  const std::string& source_name = source_location.text();
  auto start = std::chrono::steady_clock::now();
  if (options.ranks < 1) throw UsageError("reshard: --ranks must be at least 1, got " + std::to_string(options.ranks));
  if (options.memory_budget_bytes == 0) throw UsageError("reshard: the memory budget must be more than 0 bytes");
  if (options.save.thread_count < 1) {
    throw UsageError("reshard: thread_count must be >= 1, found " + std::to_string(options.save.thread_count));
  }
  if (options.save.checksum_block_bytes == 0) throw UsageError("reshard: checksum_block_bytes must be > 0");
  if (!destination.list("").empty()) {
    throw UsageError("reshard: destination " + destination.url() + " is not empty");
  }

  // 1. Open the source and list its leaves.
  std::unique_ptr<ReshardSource> source = open_source(source_location, options);
  const std::vector<SourceLeaf>& leaves = source->leaves();
  ReshardReport report;
  report.source_format = source->format();
  // A Lightning checkpoint's meta.pt, checked before anything is written and published
  // after `.metadata` (its commit marker), so the output is a Lightning checkpoint too.
  const std::optional<LightningMeta> meta = naming_source(
      source_name, [&] { return source->lightning_meta(options.verify_checksums && options.check_zip_crc); });
  std::map<ObjectPath, std::size_t> leaf_of_path;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    leaf_of_path[leaves[i].path] = i;
    if (!leaves[i].is_tensor) {
      ++report.objects;
      continue;
    }
    ++report.tensors;
    report.payload_bytes += leaf_bytes(leaves[i]);
  }

  // 2. Plan as save() does.
  std::vector<FlatStateDict> flats;
  std::vector<SavePlan> local_plans;
  for (int r = 0; r < options.ranks; ++r) {
    flats.push_back(rank_leaves(leaves, r, options.ranks));
    local_plans.push_back(make_local_save_plan(flats.back(), r));
  }
  SavePlanOptions plan_options;
  // Files per rank as save() writes them on the destination (more on object stores), so
  // that a load of the output reads as many objects per rank as one of a saved checkpoint.
  plan_options.thread_count = files_per_rank(options.save.thread_count, destination.features());
  plan_options.single_file_per_rank = true;
  plan_options.dedup_to_lowest_rank = options.save.dedup_to_lowest_rank;
  GlobalSavePlan global = make_global_save_plan(std::move(local_plans), plan_options);
  const std::vector<FileTask> tasks = file_tasks(global);

  // 3. Write the files, streaming each item from the source.
  std::size_t workers = options.parallel_files > 0 ? static_cast<std::size_t>(options.parallel_files) : 4;
  workers = std::max<std::size_t>(1, std::min(workers, tasks.size()));
  const std::uint64_t slab_bytes = std::max(kMinSlabBytes, options.memory_budget_bytes / workers);
  report.slab_bytes = slab_bytes;
  ItemWriteOptions item_options;
  item_options.checksum = options.save.checksum;
  item_options.block_size = options.save.checksum_block_bytes;
  item_options.compression = options.save.compression;
  item_options.zstd_level = options.save.compression_level;
  // Files are written in parallel already; libzstd's workers only when asked for.
  item_options.zstd_workers = options.save.compression_threads > 1 ? options.save.compression_threads : 0;
  storage::WriteOptions write_options;
  write_options.durable = options.save.durable;
  write_options.direct_io = options.save.direct_io;

  std::vector<std::vector<WrittenItem>> written(tasks.size());
  std::vector<char> committed(tasks.size(), 0);
  bool committed_metadata = false;
  std::atomic<std::uint64_t> copied{0};
  try {
    parallel_for(tasks.size(), workers, [&](std::size_t t) {
      const FileTask& task = tasks[t];
      const FlatStateDict& flat = flats[static_cast<std::size_t>(task.rank)];
      std::vector<std::byte> slab;
      std::unique_ptr<storage::StorageWriter> writer = destination.open_writer(task.file, write_options);
      for (const WriteItem* item : task.items) {
        const FlatValue& value = flat.items.at(item->index.fqn);
        const auto found = leaf_of_path.find(flat.planner_data.at(item->index.fqn));
        if (item->type == WriteItemType::kBytes) {
          const SourceLeaf* object = found != leaf_of_path.end() ? &leaves[found->second] : nullptr;
          if (object != nullptr && object->object_archive) {
            written[t].push_back(naming_source(source_name, [&] {
              return write_object_item(*writer, task.file, *item, *object->object, *object->object_archive,
                                       item_options);
            }));
          } else {
            written[t].push_back(write_item(*writer, task.file, *item, value, item_options));
          }
          continue;
        }
        if (found == leaf_of_path.end()) {
          throw Error("reshard: item \"" + item->index.fqn + "\" has no source tensor (internal error)");
        }
        const std::size_t leaf = found->second;
        const format::ChunkStorageMetadata& chunk = item->chunk;
        auto produce = [&](const std::function<void(ByteSpan)>& write) {
          for_each_box(chunk.sizes, dtype_itemsize(item->dtype), slab_bytes,
                       [&](const Shape& offsets, const Shape& sizes, std::uint64_t n) {
                         Shape global_offsets(offsets);
                         for (std::size_t d = 0; d < global_offsets.size(); ++d) global_offsets[d] += chunk.offsets[d];
                         if (slab.size() < n) slab.resize(static_cast<std::size_t>(n));
                         std::span<std::byte> piece(slab.data(), static_cast<std::size_t>(n));
                         naming_source(source_name, [&] { source->read_box(leaf, global_offsets, sizes, piece); });
                         copied += n;
                         write(piece);
                       });
        };
        written[t].push_back(write_tensor_item(*writer, task.file, *item, produce, item_options));
      }
      writer->commit();
      committed[t] = 1;
    });

    // 4. Commit as save()'s coordinator does (it removes the sidecar again on failure).
    for (const auto& items : written) {
      for (const WrittenItem& w : items) report.bytes_written += w.info.length;
    }
    save_steps::commit_checkpoint(destination, std::move(global.metadata), written, options.save);
    committed_metadata = true;
    if (meta) {
      publish_lightning_meta(destination, *meta, options.save.durable);
      report.meta_pt_bytes = meta->bytes.size();
    }
  } catch (...) {
    // Best effort: without `.metadata` the files are not a checkpoint anyway; a failed
    // meta.pt uncommits the DCP part, so no half-Lightning checkpoint is left.
    if (committed_metadata) {
      for (const char* key : {kMetadataKey, kChecksumSidecar, kIndexKey}) {
        try {
          destination.remove(key);
        } catch (...) {
        }
      }
    }
    for (std::size_t t = 0; t < tasks.size(); ++t) {
      if (!committed[t]) continue;
      try {
        destination.remove(tasks[t].file);
      } catch (...) {
      }
    }
    throw;
  }
  report.copied_bytes = copied.load();
  report.zip_crc = source->zip_crc_counts();
  if (meta) report.zip_crc += meta->crc;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace shardpoint::engine
