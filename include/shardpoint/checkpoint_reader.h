// CheckpointReader: random access to a committed DCP checkpoint from one process, without
// a communicator: any box of any tensor, any object. The building block of `inspect`,
// `verify`, `consolidate` and `reshard`, which all stream a checkpoint piece by piece
// with bounded memory.
//
// Opening reads `.metadata` and, when present and asked for, the checksum sidecar. Reads
// go through the same path as load(): only the byte runs of the saved chunks that overlap
// the requested box are read, widened to checksum blocks when verifying against a sidecar;
// without one, the zip CRC-32s of the records read are checked (check_zip_crc).
//
// Thread-safety: read_box(), read_object() and read_object_file() may be called from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "shardpoint/byte_stream.h"
#include "shardpoint/metadata.h"
#include "shardpoint/mutex.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/state_dict.h"
#include "shardpoint/storage.h"
#include "shardpoint/zip_crc_counts.h"

namespace shardpoint::torchfile {
class TorchFile;  // a torch.save archive held in memory (internal: torchfile/torch_file.h)
}  // namespace shardpoint::torchfile

namespace shardpoint::engine {

class ChecksumSidecar;  // the checksum sidecar (internal: engine/checksum_sidecar.h)
struct BlobChecksums;   // internal: engine/item_reader.h

// Bytes a reader took from storage.
struct ReadCounts {
  std::uint64_t header_bytes = 0;  // zip records and data.pkl of tensor blobs
  std::uint64_t data_bytes = 0;    // tensor data and whole bytes-item blobs (incl. widening)
  ReadCounts& operator+=(const ReadCounts& o) {
    header_bytes += o.header_bytes;
    data_bytes += o.data_bytes;
    return *this;
  }
};

struct CheckpointReaderOptions {
  // Verify every byte read against the sidecar (when the checkpoint has one).
  bool verify_checksums = true;
  // Where no sidecar entry covers a blob, check the zip CRC-32 of each record once all of
  // it has been read (by any read_box/read_object calls; engine/zip_crc_ledger.cc). Applies only
  // with verify_checksums. Off: such blobs are read unverified.
  bool check_zip_crc = true;
};

class CheckpointReader {
 public:
  // Opens the checkpoint in `storage` (which must outlive the reader): a DCP folder, or a
  // Hugging Face safetensors folder (no `.metadata`; its safetensors headers give the
  // metadata). Throws StorageError ("not a committed checkpoint (no .metadata)"),
  // FormatError for a bad .metadata/sidecar/safetensors header.
  CheckpointReader(storage::Storage& storage, CheckpointReaderOptions options = {});
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const format::Metadata& metadata() const { return metadata_; }
  // True when the tensor items are raw safetensors bytes (a Hugging Face folder, or DCP's
  // safetensors serialization): no torch.save blob, no zip CRC-32, read by byte range.
  bool raw_tensor_items() const { return raw_tensor_items_; }
  // The checksum sidecar, when the checkpoint has one and options.verify_checksums;
  // nullptr otherwise (always for PyTorch-written checkpoints). Owned by the reader.
  const ChecksumSidecar* sidecar() const;
  storage::Storage& storage() const { return storage_; }

  // The tensor entry of fqn; throws PlanError when fqn is missing or is a bytes item.
  const format::TensorStorageMetadata& tensor(const std::string& fqn) const;

  // Fills dest (row-major, volume(sizes) * itemsize bytes) with the box [offsets,
  // offsets+sizes) of tensor fqn. Throws PlanError when the box is outside the tensor or
  // the saved chunks do not cover it, FormatError/StorageError naming file and fqn.
  void read_box(const std::string& fqn, const Shape& offsets, const Shape& sizes, std::span<std::byte> dest);

  // The object saved under fqn (a bytes item), as torch.load would return it.
  pickle::ValuePtr read_object(const std::string& fqn);
  // The bytes item under fqn opened as the torch.save archive it is (held in memory): its
  // root is read_object()'s object, and the storages of the tensors that object holds are
  // the archive's records (torchfile/tree_storages.h copies them). Throws as read_object().
  std::shared_ptr<const torchfile::TorchFile> read_object_file(const std::string& fqn);

  // Bytes read so far (headers and data).
  ReadCounts counts() const;
  // The zip CRC-32 checks so far; records_partial counts records read only in part so far.
  ZipCrcCounts zip_crc_counts() const;

 private:
  std::shared_ptr<const ByteSource> source(const std::string& relative_path);
  BlobChecksums checksums_for(const format::StorageInfo& info) const;
  const format::StorageInfo& storage_info(const format::MetadataIndex& index) const;
  // A Metadata holding only fqn's entry and its storage_data (cached; what read_box plans on).
  const format::Metadata& tensor_metadata(const std::string& fqn);

  struct State;  // the sidecar, the open sources, per-tensor metadata (checkpoint_reader.cc)

  storage::Storage& storage_;
  CheckpointReaderOptions options_;
  format::Metadata metadata_;
  bool raw_tensor_items_ = false;
  std::unique_ptr<State> state_;
  mutable Mutex mu_;  // also guards state_->per_tensor
  ReadCounts counts_ SP_GUARDED_BY(mu_);
};

}  // namespace shardpoint::engine
