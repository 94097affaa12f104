// I/O for checkpoints whose plan another planner made: PyTorch DCP's planner, reached through
// the C API (include/shardpoint/c_api.h) by the Python package's StorageWriter and
// StorageReader. DCP keeps its planning and its collectives; these functions move the
// bytes, checksum them, verify them and commit, with the same steps save() and load() use.
//
// Save: every rank calls write_planned_files() for its files; the coordinator then calls
// commit_planned() with the `.metadata` pickle DCP's Metadata became and every rank's
// written items (gathered by DCP). Load: a PlannedReader per rank reads the blobs DCP's
// read plan names, straight into the caller's buffers, verified against the checksum
// sidecar when the checkpoint has one.
//
// Thread-safety: the free functions are reentrant; a PlannedReader may be used from
// several threads at once after construction.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/byte_stream.h"
#include "engine/checksum_sidecar.h"
#include "engine/item_writer.h"
#include "engine/zip_crc_ledger.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/metadata.h"
#include "shardpoint/storage.h"

namespace shardpoint::engine {

class SourceCache;

// One item of a planned file: a tensor chunk (row-major bytes in the caller's memory) or a
// blob already serialized by the caller (a DCP bytes item: torch.save output).
struct PlannedItem {
  WriteItemType type = WriteItemType::kTensor;
  format::MetadataIndex index;  // fqn; for tensors the chunk's global offsets
  DType dtype = DType::kFloat32;
  Shape sizes;     // tensor chunk sizes
  ByteSpan bytes;  // tensor data (product(sizes) * itemsize bytes) or the blob
};

struct PlannedFile {
  std::string name;  // "__0_0.distcp"
  std::vector<PlannedItem> items;
};

// Writes `files` into the checkpoint folder (options.thread_count at a time; O_DIRECT,
// checksums and durability as SaveOptions say) and returns what each item became, in file
// order. A failure removes this call's files again. Throws UsageError for a tensor whose
// byte count does not match its sizes and dtype, and before writing anything when the
// folder holds a committed `.metadata` (a committed checkpoint is never written again);
// StorageError naming the file and item.
std::vector<WrittenItem> write_planned_files(storage::Storage& checkpoint, const std::vector<PlannedFile>& files,
                                             const SaveOptions& options);

// Commits a checkpoint whose data files every rank wrote: the checksum sidecar from
// `written` (all ranks' items), the load index when `metadata_bytes` decodes as DCP
// metadata shardpoint can index, then `.metadata` = metadata_bytes, atomically. Throws
// StorageError; nothing is committed then.
void commit_planned(storage::Storage& checkpoint, std::string_view metadata_bytes,
                    const std::vector<WrittenItem>& written, const SaveOptions& options);

// One tensor read: the part [storage_offsets, storage_offsets + lengths) of a saved chunk
// into `dest`, the row-major box of `lengths`.
struct PlannedTensorRead {
  format::StorageInfo blob;  // file, offset and length of the chunk's blob
  std::string fqn;
  format::ChunkStorageMetadata chunk;  // the saved chunk: global offsets and sizes
  DType dtype = DType::kFloat32;
  Shape storage_offsets;
  Shape lengths;
  std::span<std::byte> dest;
};

struct PlannedReaderOptions {
  // Verify every byte read against the checksum sidecar, when the checkpoint has one.
  bool verify_checksums = true;
  // Where no sidecar entry covers a blob (PyTorch's checkpoints), check the zip CRC-32 of
  // every record read whole, over the reader's life (zip_crc_ledger.h). Applies only with
  // verify_checksums.
  bool check_zip_crc = true;
  // Blobs read in parallel.
  int thread_count = 4;
};

class PlannedReader {
 public:
  // Opens a committed checkpoint: reads `.metadata` (kept for metadata_bytes()), the load
  // index when it matches those bytes, else the checksum sidecar when present. Throws
  // StorageError kNotFound ("not a committed checkpoint") without `.metadata`, FormatError
  // for a damaged sidecar.
  PlannedReader(storage::Storage& checkpoint, PlannedReaderOptions options = {});
  ~PlannedReader();
  PlannedReader(const PlannedReader&) = delete;
  PlannedReader& operator=(const PlannedReader&) = delete;

  // The exact `.metadata` bytes (DCP's Metadata pickle); for a Hugging Face folder or DCP's
  // safetensors serialization, the Metadata whose tensor items name their raw bytes
  // (safetensors_metadata.h), encoded as `.metadata`.
  const std::string& metadata_bytes() const { return metadata_bytes_; }
  // Those bytes decoded (once, when the reader opened; nothing in them is executed). Throws
  // FormatError naming the `.metadata` when they are not DCP metadata.
  const format::Metadata& metadata() const;
  // True when reads are verified (a sidecar or index holds checksums and options ask).
  bool verified() const { return checksums_.has_value() && options_.verify_checksums; }
  // True when blobs no sidecar covers have their zip CRC-32s checked.
  bool checks_zip_crc() const { return options_.verify_checksums && options_.check_zip_crc; }
  // The zip CRC-32 checks so far; records_partial: records read only in part so far.
  ZipCrcCounts zip_crc_counts() const { return zip_crc_.counts(); }

  // Reads every request, the requests of one blob through one opened blob, blobs in
  // parallel. Throws FormatError / StorageError naming the file and fqn; destinations may
  // be partly filled then.
  void read_tensors(std::span<const PlannedTensorRead> requests);

  // The whole blob `blob` (a bytes item: torch.save output), verified against its item
  // checksum when verified(), else its zip CRC-32s when checks_zip_crc(). Throws
  // FormatError on a mismatch, StorageError.
  std::string read_blob(const format::StorageInfo& blob, const std::string& fqn);

  // The stream transforms of the blob (docs/dcp-format.md §2.4): blob's own when it lists
  // any, else what `.metadata` records for the item at its file and offset. read_tensors
  // and read_blob undo them, so callers may name a blob by file, offset and length alone.
  const std::vector<std::string>& transforms_of(const format::StorageInfo& blob) const;

 private:
  storage::Storage& checkpoint_;
  PlannedReaderOptions options_;
  std::string metadata_bytes_;
  std::optional<format::Metadata> metadata_;  // metadata_bytes_ decoded; empty when they are not DCP metadata
  std::string metadata_error_;                // why, when metadata_ is empty
  bool raw_tensor_items_ = false;             // folder_metadata.h
  std::optional<ChecksumSidecar> checksums_;
  std::map<std::pair<std::string, std::uint64_t>, std::uint64_t> data_offsets_;           // (file, blob offset)
  std::map<std::pair<std::string, std::uint64_t>, std::vector<std::string>> transforms_;  // non-empty only
  std::unique_ptr<SourceCache> sources_;
  ZipCrcLedger zip_crc_;
};

}  // namespace shardpoint::engine
