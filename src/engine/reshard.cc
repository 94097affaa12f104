#include "engine/reshard.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "comm/thread_communicator.h"
#include "core/error.h"
#include "engine/checkpoint_reader.h"
#include "engine/chunking.h"
#include "engine/flatten.h"
#include "pickle/repr.h"
#include "storage/storage_registry.h"
#include "torchfile/torch_file.h"

namespace shardpoint::engine {
namespace {

using pickle::Kind;
using pickle::Value;

// One leaf of the source in DCP flattening order.
struct SourceLeaf {
  std::string fqn;
  ObjectPath path;
  bool is_tensor = false;
  DType dtype = DType::kFloat32;
  Shape shape;
  bool requires_grad = false;
  bool replicated = false;       // written whole once
  pickle::ValuePtr object;       // objects (read at open)
};

std::uint64_t element_count(const Shape& shape) {
  std::uint64_t n = 1;
  for (auto s : shape) n *= static_cast<std::uint64_t>(s);
  return n;
}

std::uint64_t leaf_bytes(const SourceLeaf& leaf) { return element_count(leaf.shape) * dtype_itemsize(leaf.dtype); }

// A checkpoint read box by box. Implementations are thread-safe for read_rows().
class ReshardSource {
 public:
  virtual ~ReshardSource() = default;
  virtual std::string format() const = 0;
  const std::vector<SourceLeaf>& leaves() const { return leaves_; }
  // Zero-copy bytes of rows [row, row + rows) of tensor leaf i (all of a 0-dim tensor),
  // when the source is mapped and the rows are stored contiguously as little-endian.
  virtual std::optional<ByteSpan> view_rows(std::size_t i, std::int64_t row, std::int64_t rows) const {
    return std::nullopt;
  }
  // Copies rows [row, row + rows) of tensor leaf i (all of a 0-dim tensor) into dest.
  virtual void read_rows(std::size_t i, std::int64_t row, std::int64_t rows, std::span<std::byte> dest) = 0;

 protected:
  std::vector<SourceLeaf> leaves_;
};

class DcpSource final : public ReshardSource {
 public:
  DcpSource(const std::string& path, bool verify)
      : storage_(storage::open_storage(path)), reader_(*storage_, CheckpointReaderOptions{.verify_checksums = verify}) {
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
        leaf.replicated = leaf.shape.empty() ||
                          (sharded && t->chunks.size() == 1 && t->chunks[0].sizes == t->size &&
                           std::all_of(t->chunks[0].offsets.begin(), t->chunks[0].offsets.end(),
                                       [](std::int64_t o) { return o == 0; }));
      } else {
        leaf.object = reader_.read_object(fqn);
      }
      leaves_.push_back(std::move(leaf));
    }
  }

  std::string format() const override { return "dcp"; }

  void read_rows(std::size_t i, std::int64_t row, std::int64_t rows, std::span<std::byte> dest) override {
    const SourceLeaf& leaf = leaves_[i];
    Shape offsets(leaf.shape.size(), 0), sizes = leaf.shape;
    if (!sizes.empty()) {
      offsets[0] = row;
      sizes[0] = rows;
    }
    reader_.read_box(leaf.fqn, offsets, sizes, dest);
  }

 private:
  std::unique_ptr<storage::Storage> storage_;
  CheckpointReader reader_;
};

// A torch.save file walked as `inspect` walks it (DCP >= 2.4 flattening; tuples holding
// tensors are descended like lists).
class TorchSource final : public ReshardSource {
 public:
  explicit TorchSource(const std::string& path) : path_(path), file_(torchfile::TorchFile::open(path)) {
    const Value& root = *file_->root();
    if (!is_mapping(root)) {
      throw FormatError(path + ": the root object is " + pickle::repr(root).substr(0, 60) +
                        ", not a mapping; a DCP checkpoint needs a state dict");
    }
    walk(file_->root(), {}, 0);
  }

  std::string format() const override { return "torch"; }

  std::optional<ByteSpan> view_rows(std::size_t i, std::int64_t row, std::int64_t rows) const override {
    auto range = contiguous_range(i, row, rows);
    if (!range) return std::nullopt;
    return file_->source().view(range->first, range->second, "tensor data");
  }

  void read_rows(std::size_t i, std::int64_t row, std::int64_t rows, std::span<std::byte> dest) override {
    if (auto range = contiguous_range(i, row, rows)) {
      file_->source().read(range->first, dest, "tensor data");
      return;
    }
    // Strided or big-endian: read the whole tensor row-major, keep the rows asked for.
    const torchfile::TensorInfo& info = *infos_[i];
    std::vector<std::byte> whole(info.nbytes());
    file_->read_tensor(info, whole);
    std::uint64_t row_bytes = info.shape.empty() ? whole.size() : element_count({info.shape.begin() + 1, info.shape.end()}) * dtype_itemsize(info.dtype);
    std::uint64_t begin = info.shape.empty() ? 0 : static_cast<std::uint64_t>(row) * row_bytes;
    std::memcpy(dest.data(), whole.data() + begin, dest.size());
  }

 private:
  static constexpr int kMaxDepth = 1000;

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
    if (depth > kMaxDepth) throw FormatError(path_ + ": nesting deeper than " + std::to_string(kMaxDepth));
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
    // Shares the node of the file's tree; the TorchFile outlives the save.
    leaf.object = node;
    infos_.push_back(nullptr);
    leaves_.push_back(std::move(leaf));
  }

  // (source offset, bytes) of rows [row, row + rows) when stored contiguously, little-endian.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> contiguous_range(std::size_t i, std::int64_t row,
                                                                          std::int64_t rows) const {
    const torchfile::TensorInfo& info = *infos_[i];
    if (info.big_endian || !info.is_contiguous()) return std::nullopt;
    std::uint64_t itemsize = dtype_itemsize(info.dtype);
    std::uint64_t row_elems = info.shape.empty() ? 1 : element_count({info.shape.begin() + 1, info.shape.end()});
    std::uint64_t first = static_cast<std::uint64_t>(info.storage_offset) + static_cast<std::uint64_t>(row) * row_elems;
    std::uint64_t count = info.shape.empty() ? 1 : static_cast<std::uint64_t>(rows) * row_elems;
    return std::make_pair(info.storage.offset + first * itemsize, count * itemsize);
  }

  std::string path_;
  std::unique_ptr<torchfile::TorchFile> file_;
  std::vector<const torchfile::TensorInfo*> infos_;  // per leaf; nullptr for objects
};

std::unique_ptr<ReshardSource> open_source(const std::string& path, bool verify) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw_os_error("open", path, errno);
  if (S_ISDIR(st.st_mode)) return std::make_unique<DcpSource>(path, verify);
  return std::make_unique<TorchSource>(path);
}

// A rank's boxes: the tree handed to save() and the buffers its tensors point into.
struct RankState {
  FlatStateDict flat;
  std::vector<std::vector<std::byte>> buffers;
  std::uint64_t copied = 0;
};

// save() reads TensorShard::data and never writes it, so a read-only view of the mapped
// source may stand in for a buffer.
std::span<std::byte> as_writable(ByteSpan s) {
  return {const_cast<std::byte*>(s.data()), s.size()};
}

}  // namespace

ReshardReport reshard(const std::string& source_path, storage::Storage& destination, const ReshardOptions& options) {
  auto start = std::chrono::steady_clock::now();
  if (options.ranks < 1) throw UsageError("reshard: --ranks must be at least 1, got " + std::to_string(options.ranks));
  if (!destination.list("").empty()) {
    throw UsageError("reshard: destination " + destination.url() + " is not empty");
  }

  // 1. Open the source and list its leaves.
  std::unique_ptr<ReshardSource> source = open_source(source_path, options.verify_checksums);
  const std::vector<SourceLeaf>& leaves = source->leaves();
  ReshardReport report;
  report.source_format = source->format();

  // 2. Replicated tensors once, shared by every rank.
  std::map<std::size_t, std::vector<std::byte>> replicated;
  std::map<std::size_t, ByteSpan> replicated_view;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const SourceLeaf& leaf = leaves[i];
    if (!leaf.is_tensor) {
      ++report.objects;
      continue;
    }
    ++report.tensors;
    report.payload_bytes += leaf_bytes(leaf);
    if (!leaf.replicated) continue;
    std::int64_t rows = leaf.shape.empty() ? 1 : leaf.shape[0];
    if (auto view = source->view_rows(i, 0, rows)) {
      replicated_view[i] = *view;
    } else {
      auto& buffer = replicated[i];
      buffer.resize(leaf_bytes(leaf));
      source->read_rows(i, 0, rows, buffer);
      report.copied_bytes += buffer.size();
    }
  }

  // 3. Each rank fills its boxes and saves.
  std::vector<RankState> ranks(static_cast<std::size_t>(options.ranks));
  std::vector<std::uint64_t> written(ranks.size(), 0);
  comm::ThreadGroup group(options.ranks);
  group.run([&](comm::Communicator& comm) {
    RankState& mine = ranks[static_cast<std::size_t>(comm.rank())];
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      const SourceLeaf& leaf = leaves[i];
      mine.flat.planner_data[leaf.fqn] = leaf.path;
      if (!leaf.is_tensor) {
        mine.flat.items[leaf.fqn] = leaf.object;
        continue;
      }
      TensorShard shard;
      shard.dtype = leaf.dtype;
      shard.global_shape = leaf.shape;
      shard.requires_grad = leaf.requires_grad;
      if (leaf.replicated) {
        shard.offsets.assign(leaf.shape.size(), 0);
        shard.sizes = leaf.shape;
        auto view = replicated_view.find(i);
        shard.data = view != replicated_view.end() ? as_writable(view->second) : std::span<std::byte>(replicated.at(i));
      } else {
        Box box = shard_box(leaf.shape, {options.ranks}, {Placement::shard(0)}, {comm.rank()});
        shard.offsets = box.offsets;
        shard.sizes = box.sizes;
        std::uint64_t nbytes = element_count(box.sizes) * dtype_itemsize(leaf.dtype);
        if (nbytes > 0) {
          if (auto view = source->view_rows(i, box.offsets[0], box.sizes[0])) {
            shard.data = as_writable(*view);
          } else {
            mine.buffers.emplace_back(nbytes);
            source->read_rows(i, box.offsets[0], box.sizes[0], mine.buffers.back());
            shard.data = mine.buffers.back();
            mine.copied += nbytes;
          }
        }
      }
      mine.flat.items[leaf.fqn] = std::move(shard);
    }
    StateNode state = unflatten_state_dict(mine.flat);
    SaveReport saved = save(state, destination, comm, options.save);
    written[static_cast<std::size_t>(comm.rank())] = saved.bytes_written;
  });
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    report.copied_bytes += ranks[r].copied;
    report.bytes_written += written[r];
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace shardpoint::engine
