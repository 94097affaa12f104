// Writing one save item into a .distcp file: a complete torch.save blob appended at the
// file's current position (docs/dcp-format.md §2.1), checksummed as its bytes stream out;
// with ItemWriteOptions::compression, compressed into one zstd frame first (§2.4: the
// checksums cover the stored bytes, and the item has no data_offset).
//
// A tensor item is torch.save of the chunk: archive "archive", root
// _rebuild_tensor_v2(('storage', torch.<T>Storage, "0", "cpu", numel), 0, sizes,
// contiguous strides, False, OrderedDict()), one storage record data/0 holding exactly the
// chunk's row-major bytes, read from the caller's buffer as it streams out.
// A bytes item is torch.save of the object's pickle value: no storages, or, for an object
// that holds tensors, the storages it references copied from the archive it was read from.
//
// Thread-safety: reentrant; one sink per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/byte_stream.h"
#include "engine/flatten.h"
#include "engine/save_plan.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/metadata.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/torch_file.h"

namespace shardpoint::engine {

// What one written item reports to the coordinator.
struct WrittenItem {
  format::MetadataIndex index;        // fqn; chunk offsets and position for tensors (none for bytes)
  format::StorageInfo info;           // relative_path, offset, length of the blob
  std::uint64_t checksum = 0;         // over the whole blob (0 with ChecksumAlgorithm::kNone)
  std::vector<std::uint64_t> blocks;  // per block_size piece of the blob
  // Tensor items: where the tensor bytes (the data record) start inside the blob.
  std::optional<std::uint64_t> data_offset;
  bool operator==(const WrittenItem& o) const {
    return index == o.index && index.index == o.index.index && info == o.info && checksum == o.checksum &&
           blocks == o.blocks && data_offset == o.data_offset;
  }
};

struct ItemWriteOptions {
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kCrc32c;
  std::uint64_t block_size = std::uint64_t{1} << 20;
  // Tensor bytes are handed to the sink in slices of this size, so the zip CRC, the item
  // checksum and the storage writer's copy touch each slice while it is in cache: the
  // default fits a core's L2; slices of several MiB fall out of L3, which the ranks share,
  // and cost more CPU per byte (zip CRC + copy + CRC-32C: 0.19 s of CPU per GB at 256 KiB,
  // 0.28 s at 4 MiB).
  std::size_t slice_bytes = std::size_t{256} << 10;
  // Tensor bytes and serialized blobs go to the file through ByteSink::write_borrowed(): an
  // object-store writer then sends them from the caller's memory instead of copying them
  // into its part buffers (a copy and its buffers' first touch: about 0.3 s of CPU per GB).
  // REQUIRES the values to outlive the file's writer (its commit or destruction); set by
  // callers that hold them that long (the save's write_item_files), not by readers that
  // reuse one buffer for every chunk (reshard, consolidate).
  bool borrow_values = false;
  // Store each blob as one zstd frame ("stream.zstd/1", docs/dcp-format.md §2.4), at this
  // level, with this many extra compression threads (SaveOptions).
  Compression compression = Compression::kNone;
  int zstd_level = 3;
  int zstd_workers = 0;
};

// Appends `item` (value = its leaf: a TensorShard for kTensor, a pickle value for kBytes)
// as one torch.save blob to `file`, whose name (`file_name`) goes into the result.
// Throws UsageError naming the fqn when the value does not match the item (kind, dtype,
// box, or a tensor without data of the planned size); StorageError from the sink.
WrittenItem write_item(ByteSink& file, const std::string& file_name, const WriteItem& item, const FlatValue& value,
                       const ItemWriteOptions& options = {});

// write_item() for a kBytes item whose object holds tensors: `object` is a node of
// `archive`'s tree (a bytes item opened with CheckpointReader::read_object_file(), or a part
// of a torch.save file), written as torch.save writes that object alone
// (torchfile/tree_storages.h: storages renumbered, their bytes copied from `archive`).
// Throws UsageError naming the fqn when the item is not kBytes; FormatError for bad
// persistent ids or storage records; StorageError from the sink.
WrittenItem write_object_item(ByteSink& file, const std::string& file_name, const WriteItem& item,
                              const pickle::Value& object, const torchfile::TorchFile& archive,
                              const ItemWriteOptions& options = {});

// Streams a tensor item's data: calls `write` with consecutive pieces of the chunk's
// row-major little-endian bytes, item.nbytes in all.
using TensorBytesProducer = std::function<void(const std::function<void(ByteSpan)>& write)>;

// write_item() for a kTensor item whose data is not in memory as one span: `produce`
// streams it piece by piece (reshard reads each box from its source in slabs), and the blob
// is byte for byte what write_item() writes for the same data. Throws UsageError naming the
// fqn when the item is not a tensor or produce() writes a different number of bytes;
// whatever produce() or the sink throws.
WrittenItem write_tensor_item(ByteSink& file, const std::string& file_name, const WriteItem& item,
                              const TensorBytesProducer& produce, const ItemWriteOptions& options = {});

// Appends `blob`, an item another writer already serialized (DCP's bytes items arrive as
// torch.save output), to `file` verbatim, checksummed as write_item() checksums its blobs.
// The result names `index` and has no data_offset. Throws StorageError from the sink.
WrittenItem write_serialized_item(ByteSink& file, const std::string& file_name, const format::MetadataIndex& index,
                                  ByteSpan blob, const ItemWriteOptions& options = {});

}  // namespace shardpoint::engine
