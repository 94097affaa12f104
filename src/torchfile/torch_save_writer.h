// TorchSaveWriter: streams a torch.save file (layout: torch_file.h, docs/dcp-format.md §5)
// to a ByteSink, one storage at a time, so memory never holds more than the caller's
// current piece of tensor data plus the zip central directory.
//
// Protocol (each step once, in this order):
//   1. write_pickle(root): the object tree, with tensor nodes made by make_tensor_node()
//      (and make_parameter_node()); written as <archive>/data.pkl in pickle protocol 2,
//      then <archive>/byteorder = "little" (PyTorch >= 2.1 writes it there).
//   2. every storage the tree references, in any order, as <archive>/data/<key>:
//      begin_storage(key, nbytes) + write(...)* + end_storage(), or write_storage(key, bytes).
//      The bytes are little-endian elements. Each storage is written once.
//   3. finish(): <archive>/version = "3\n", <archive>/.data/serialization_id, central
//      directory and end records. Throws UsageError if a referenced storage is missing.
// Record order therefore matches PyTorch >= 2.1 (data.pkl, byteorder, data/*, version,
// .data/serialization_id); storages appear in the caller's order (PyTorch <= 2.5 sorts
// keys as strings, >= 2.6 numerically; readers do not care).
//
// serialization_id is PyTorch's definition (caffe2 PyTorchStreamWriter::
// writeSerializationId): 20 digits of the record-name hash, folding
// hash_combine(h, std::hash<std::string>(name)) over the names (without the archive
// folder) in the iteration order of a std::unordered_set filled in write order, then 20
// digits of hash_combine folded over each record's CRC-32 in write order; hash_combine(a,
// b) = a ^ (b + 0x9e3779b9 + (a << 6) + (a >> 2)). Built with libstdc++, as Linux PyTorch
// is, this gives PyTorch's value (checked against PyTorch 2.6 output); elsewhere it is
// still 40 deterministic digits. One quirk is not reproduced: PyTorch spots descriptors by
// their PK\7\8 signature in each write, so a record whose data itself starts with PK\7\8
// also folds in that data's bytes 4..8. Readers only log the id.
//
// The file loads with torch.load(weights_only=True) in PyTorch 1.13+ when the tree holds
// only tensors, parameters and plain containers (dict, list, tuple, OrderedDict, str,
// int, float, bool, None).
//
// Thread-safety: single-writer. The sink must outlive the writer; finish() does not flush
// it. A writer abandoned before finish() leaves an incomplete file (caller discards it).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>

#include "core/byte_stream.h"
#include "shardpoint/dtype.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/zip_writer.h"

namespace shardpoint::torchfile {

// True for dtypes PyTorch saves with a legacy typed storage and _rebuild_tensor_v2
// (float32/64/16, bfloat16, complex64/128, int8/16/32/64, uint8, bool); false for those
// saved as torch.UntypedStorage + _rebuild_tensor_v3 (uint16/32/64, float8 variants,
// complex32), which only PyTorch >= 2.1-2.3 can load.
bool uses_legacy_storage(DType dtype);

// The tensor node torch.save pickles for a dense tensor:
//   REDUCE(torch._utils._rebuild_tensor_v2, (PID, storage_offset, shape, strides,
//          requires_grad, collections.OrderedDict()))
// (v3 adds the dtype global torch.<dtype> after the hooks), with
//   PID = ('storage', torch.<Type>Storage, storage_key, location, storage_numel)
// storage_numel counts elements of dtype. For the new dtypes the storage type is
// torch.storage.UntypedStorage (PyTorch 2.x's spelling) and the pid carries bytes:
// storage_numel * itemsize. Throws UsageError for mismatched shape/strides or negative
// values.
pickle::ValuePtr make_tensor_node(DType dtype, std::span<const std::int64_t> shape,
                                  std::span<const std::int64_t> strides, std::int64_t storage_offset,
                                  const std::string& storage_key, std::uint64_t storage_numel,
                                  const std::string& location = "cpu", bool requires_grad = false);

// torch.nn.Parameter as torch.save pickles it:
// REDUCE(torch._utils._rebuild_parameter, (tensor, requires_grad, OrderedDict())).
pickle::ValuePtr make_parameter_node(pickle::ValuePtr tensor, bool requires_grad = true);

// Row-major contiguous strides of shape.
std::vector<std::int64_t> contiguous_strides(std::span<const std::int64_t> shape);

// The 40-digit .data/serialization_id for records (names without the archive folder, and
// CRC-32s) in write order. See the header comment.
std::string serialization_id(const std::vector<std::pair<std::string, std::uint32_t>>& records);

struct TorchSaveOptions {
  // Folder name of every record. torch.save uses "archive" for streams (and DCP blobs)
  // and the file's base name without extension when given a path.
  std::string archive_name = "archive";
  // Passed to the zip writer (alignment 64 as torch.save; force_zip64 for tests).
  ZipWriterOptions zip;
  // Storages referenced by the tree must all be written before finish(), with the size
  // the tree gives them. Turn off only to write deliberately broken files in tests.
  bool check_storages = true;
};

class TorchSaveWriter {
 public:
  explicit TorchSaveWriter(ByteSink& sink, TorchSaveOptions options = {});

  TorchSaveWriter(const TorchSaveWriter&) = delete;
  TorchSaveWriter& operator=(const TorchSaveWriter&) = delete;

  // Step 1. Throws UsageError when called twice or after storages; UsageError from the
  // pickle writer for trees it cannot write.
  void write_pickle(const pickle::Value& root);
  // Step 2. Throws UsageError out of order, for a key not referenced by the tree, a
  // storage written twice, or a byte count different from the tree's.
  void begin_storage(const std::string& key, std::uint64_t nbytes);
  void write(ByteSpan data);
  // write() through the sink's write_borrowed(): the sink may read data later (byte_stream.h).
  void write_borrowed(ByteSpan data);
  void end_storage();
  void write_storage(const std::string& key, ByteSpan bytes);
  // Step 3.
  void finish();

  // Storages the tree references that are still to be written: key -> bytes.
  const std::map<std::string, std::uint64_t>& pending_storages() const { return pending_; }
  const ZipWriter& zip() const { return zip_; }

 private:
  void write_record(const std::string& name, std::string_view data);

  TorchSaveOptions options_;
  ZipWriter zip_;
  bool pickled_ = false;
  bool finished_ = false;
  std::map<std::string, std::uint64_t> pending_;  // referenced, not yet written
  std::map<std::string, std::uint64_t> written_;
};

}  // namespace shardpoint::torchfile
