// The DCP checkpoint index (`.metadata`) as C++ values.
//
// Mirrors PyTorch's torch.distributed.checkpoint.metadata dataclasses
// (docs/dcp-format.md §3): for every flattened key (fqn) either a tensor
// (global size, dtype, and the chunks it was saved in) or a bytes item (a pickled object);
// `storage_data` says where each chunk / bytes item lives (file, offset, length);
// `planner_data` maps each fqn to its path in the original nested state dict.
// The codec (metadata_codec.h) reads every form PyTorch 1.13 ... newest writes and writes
// the form PyTorch 2.0 ... newest loads.
//
// Plain values: copyable, comparable, no I/O. Thread-compatible.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "shardpoint/dtype.h"
#include "shardpoint/pickle_value.h"

namespace shardpoint::format {

using Shape = std::vector<std::int64_t>;

// A box in a tensor's global index space: [offsets, offsets + sizes).
struct ChunkStorageMetadata {
  Shape offsets;
  Shape sizes;
  bool operator==(const ChunkStorageMetadata&) const = default;
};

struct TensorProperties {
  DType dtype = DType::kFloat32;
  bool requires_grad = false;
  bool pin_memory = false;
  // Memory format enum as pickled (0 contiguous, 1 channels_last, 2 preserve). DCP always
  // records 0.
  int memory_format = 0;
  // The saved tensor's strides: a sixth element newer PyTorch (2.9+) pickles, None or a
  // tuple of ints. Absent in what older PyTorch and shardpoint's own saves write (PyTorch
  // 2.8 and older refuse the sixth element).
  std::optional<Shape> strides;
  bool operator==(const TensorProperties&) const = default;
};

struct TensorStorageMetadata {
  TensorProperties properties;
  Shape size;  // global shape; empty for a 0-dim tensor
  std::vector<ChunkStorageMetadata> chunks;
  bool operator==(const TensorStorageMetadata&) const = default;
};

struct BytesStorageMetadata {
  bool operator==(const BytesStorageMetadata&) const = default;
};

using StorageMetadata = std::variant<TensorStorageMetadata, BytesStorageMetadata>;

// Key of storage_data. Equality and ordering use (fqn, offset) only: `index` is a hint
// (PyTorch's hash/eq ignore it too). A bytes item has no offset; a 0-dim tensor chunk has
// an empty (present) offset.
struct MetadataIndex {
  std::string fqn;
  std::optional<Shape> offset;
  std::optional<std::int64_t> index;

  bool operator==(const MetadataIndex& o) const { return fqn == o.fqn && offset == o.offset; }
  bool operator<(const MetadataIndex& o) const {
    if (fqn != o.fqn) return fqn < o.fqn;
    return offset < o.offset;
  }
};

// Where one item's bytes are: [offset, offset + length) of `relative_path` inside the
// checkpoint folder, after the transforms are undone in order (2.7+, e.g. "stream.zstd/1").
struct StorageInfo {
  std::string relative_path;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::vector<std::string> transform_descriptors;
  bool operator==(const StorageInfo&) const = default;
};

// 2.4+: StorageMeta. Never written by shardpoint (breaks PyTorch <= 2.3); kept on read.
struct StorageMeta {
  std::optional<std::string> checkpoint_id;
  std::optional<std::string> save_id;
  std::optional<std::string> load_id;
  std::vector<std::string> modules;
  bool operator==(const StorageMeta&) const = default;
};

// One element of a planner_data path: a dict key or a list index.
using PathElement = std::variant<std::string, std::int64_t>;
using ObjectPath = std::vector<PathElement>;

struct Metadata {
  // Insertion order does not matter to PyTorch; std::map gives deterministic output.
  std::map<std::string, StorageMetadata> state_dict_metadata;
  // The keys of state_dict_metadata in the order the file lists them (each once), which is
  // the order the saver's state dict had; consolidation writes in it, as PyTorch does.
  // Filled by decode_metadata; empty for metadata built in memory. encode_metadata writes
  // the keys in this order when it is set.
  std::vector<std::string> key_order;
  // fqn -> path in the nested state dict. Empty map when the checkpoint has none (None in
  // the pickle); entries whose value is not a tuple of str/int are kept in
  // `planner_data_raw` only.
  std::map<std::string, ObjectPath> planner_data;
  // The planner_data pickle as read (null when written by shardpoint or absent).
  pickle::ValuePtr planner_data_raw;
  std::map<MetadataIndex, StorageInfo> storage_data;
  std::optional<StorageMeta> storage_meta;
  std::optional<std::string> version;
};

}  // namespace shardpoint::format
