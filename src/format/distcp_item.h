// One item of a `.distcp` file, opened as the torch.save archive it is.
//
// Layout (docs/dcp-format.md §2): a .distcp file is a plain concatenation of items, no
// header or padding; `_StorageInfo` (StorageInfo) gives each item's [offset, offset+length)
// in the file. An item is the complete output of torch.save (a zip archive whose internal
// offsets are relative to the item's start): a tensor chunk (root = the tensor) or a bytes
// item (root = any object; custom planners may store other bytes). Since 2.7 an item may be
// wrapped in stream transforms (`transform_descriptors`, listed in the order a reader
// undoes them); the only one PyTorch defines is "stream.zstd/1" (a zstd stream), and then
// `length` is the compressed size.
//
// Untransformed items are opened in place: a window of the file source (zero copy for
// FileSource and MappedSource; other sources are wrapped). Transformed items are
// decompressed into memory, bounded by ItemOptions::max_decompressed_bytes.
//
// Tensor data is meant to be read by range: storage_range_in_file() gives where the
// tensor's storage record lies in the .distcp file, so the engine can read only the bytes
// it needs (untransformed items only).
//
// Thread-safety: a DistcpItem is immutable after open(); const methods may be called from
// many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/byte_stream.h"
#include "shardpoint/metadata.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/torch_file.h"

namespace shardpoint::format {

struct ItemOptions {
  // Largest item size accepted after undoing a decompressing transform. The decompressed
  // item is held in memory, so this bounds the memory one open() may take and stops
  // decompression bombs. Raise it for checkpoints with larger compressed chunks.
  std::uint64_t max_decompressed_bytes = std::uint64_t{8} << 30;
};

// The transforms this build can undo ("stream.zstd/1").
bool is_known_transform(std::string_view descriptor);

// The item's bytes after undoing its transforms, copied into memory. For items that
// custom planners wrote as raw bytes. Throws FormatError (range outside the file, unknown
// transform "unknown transform 'x' on item 'fqn'", corrupt or oversized zstd data),
// StorageError on read failure.
std::string read_item_bytes(const ByteSource& distcp, const StorageInfo& info, std::string_view fqn,
                            const ItemOptions& options = {});

class DistcpItem {
 public:
  // Opens the item `info` of the .distcp file `distcp` (a whole file, or any window that
  // starts at the file's start: info.offset is relative to it). `fqn` names the item in
  // errors. Keeps a reference to distcp (the shared_ptr) or to its descriptor/mapping.
  // Throws FormatError: range outside the file, unknown transform, corrupt compressed
  // data, or not a torch.save archive ("<file>: item 'fqn' [offset+length]: ...");
  // StorageError on read failure.
  static std::unique_ptr<DistcpItem> open(std::shared_ptr<const ByteSource> distcp, const StorageInfo& info,
                                          std::string fqn, const ItemOptions& options = {});

  DistcpItem(const DistcpItem&) = delete;
  DistcpItem& operator=(const DistcpItem&) = delete;

  const std::string& fqn() const { return fqn_; }
  const StorageInfo& info() const { return info_; }
  bool transformed() const { return !info_.transform_descriptors.empty(); }
  const torchfile::TorchFile& torch_file() const { return *file_; }

  // A bytes item's object: the root of the archive's data.pkl (what torch.load returns;
  // tensors inside stay tensor nodes of torch_file()). Valid while this item lives.
  const pickle::ValuePtr& object() const { return file_->root(); }

  // A tensor item's tensor: the root must be a tensor (or Parameter) node. Throws
  // FormatError "<file>: item 'fqn': expected a tensor at the root of the torch.save blob,
  // found <kind>".
  const torchfile::TensorInfo& tensor() const;

  // Where the storage record of `tensor` (a TensorInfo of this item) lies in the .distcp
  // file: item offset + record data offset. nullopt for transformed items (their bytes
  // exist only decompressed in memory: read them through torch_file()).
  std::optional<torchfile::ByteRange> storage_range_in_file(const torchfile::TensorInfo& tensor) const;

 private:
  DistcpItem(std::string fqn, StorageInfo info, std::unique_ptr<torchfile::TorchFile> file)
      : fqn_(std::move(fqn)), info_(std::move(info)), file_(std::move(file)) {}

  std::string fqn_;
  StorageInfo info_;
  std::unique_ptr<torchfile::TorchFile> file_;
};

}  // namespace shardpoint::format
