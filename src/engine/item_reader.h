// Reading saved items back: one .distcp blob opened as the torch.save archive it is, and
// only the byte runs a ReadItem needs copied from it straight into the destination buffer
// (spec: dcp-format.md §2.1; load_plan.h for the runs).
//
// Opening a tensor blob reads its zip structure and data.pkl (a few hundred bytes, counted
// as header bytes). Reads of tensor data go from the file source into the caller's buffer
// with no staging when the saved tensor is row-major contiguous little-endian (what
// shardpoint and DCP write); any other saved layout (permuted strides, big-endian files)
// takes a slower path through a temporary copy of the chunk.
//
// Verification (a sidecar entry given): every data read is widened to the checksum blocks
// it touches, each block is read whole into a scratch buffer, checked, and the needed
// parts are copied out. A bytes item is read whole and checked against the item checksum.
// Mismatches throw FormatError naming the file, the fqn, the block and expected vs found.
//
// Thread-safety: a SavedItem is used by one thread at a time; different SavedItems over the
// same file source may be used from different threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/byte_stream.h"
#include "engine/checkpoint.h"
#include "engine/checksum_sidecar.h"
#include "engine/load_plan.h"
#include "format/metadata.h"
#include "pickle/value.h"
#include "torchfile/torch_file.h"

namespace shardpoint::engine {

// Bytes one reader took from storage.
struct ReadCounts {
  std::uint64_t header_bytes = 0;  // zip records and data.pkl of tensor blobs
  std::uint64_t data_bytes = 0;    // tensor data and whole bytes-item blobs (incl. widening)
  ReadCounts& operator+=(const ReadCounts& o) {
    header_bytes += o.header_bytes;
    data_bytes += o.data_bytes;
    return *this;
  }
};

// How to verify one blob: the sidecar's algorithm and block size and the blob's entry.
struct BlobChecksums {
  ChecksumAlgorithm algorithm = ChecksumAlgorithm::kNone;
  std::uint64_t block_size = 0;
  const ItemChecksums* item = nullptr;
};

class CountedWindow;

class SavedTensorBlob {
 public:
  // Opens the blob `info` of the .distcp file `file` (a source over the whole file) and
  // checks that its root is a tensor of `dtype` with shape `chunk_sizes`. `fqn` and
  // `chunk` name the item in errors. Throws FormatError ("<file>: item \"fqn\" chunk
  // [..]: expected ..., found ..."), StorageError.
  SavedTensorBlob(std::shared_ptr<const ByteSource> file, const format::StorageInfo& info, std::string fqn,
                  const format::ChunkStorageMetadata& chunk, DType dtype);
  ~SavedTensorBlob();
  SavedTensorBlob(const SavedTensorBlob&) = delete;
  SavedTensorBlob& operator=(const SavedTensorBlob&) = delete;

  const torchfile::TensorInfo& tensor() const { return *tensor_; }
  // True when reads go straight into the destination (row-major contiguous little-endian).
  bool direct() const;

  // Copies the part of this chunk that `item` names into `dest` (the rank's box, row-major,
  // sizes `dest_box_sizes`). REQUIRES item.storage_index is this chunk. With
  // checksums.item set, verifies as described at the top. Throws FormatError / StorageError
  // naming the file and fqn.
  void read_into(const ReadItem& item, std::span<std::byte> dest, const format::Shape& dest_box_sizes,
                 const BlobChecksums& checksums);

  ReadCounts counts() const;

 private:
  std::string describe() const;

  std::string fqn_;
  format::StorageInfo info_;
  format::ChunkStorageMetadata chunk_;
  DType dtype_;
  CountedWindow* window_ = nullptr;  // owned by file_
  std::unique_ptr<torchfile::TorchFile> file_;
  const torchfile::TensorInfo* tensor_ = nullptr;
};

// Reads the bytes item `info` of `file` whole, verifies it when checksums.item is set, and
// returns the object torch.load would (the root of its data.pkl). Adds the blob's length
// to counts.data_bytes. Throws FormatError naming the file and fqn, StorageError.
pickle::ValuePtr read_saved_object(const ByteSource& file, const format::StorageInfo& info, const std::string& fqn,
                                   const BlobChecksums& checksums, ReadCounts& counts);

}  // namespace shardpoint::engine
