// TorchFile: a torch.save file (zip format, PyTorch >= 1.6) opened for reading, with its
// object tree and the location of every tensor's bytes in the source.
//
// Layout (docs/dcp-format.md §5): a zip archive (zip_format.h) whose records all start
// with one folder name, "<archive>/": data.pkl (pickle of the object tree; storages are
// persistent ids), data/<key> (raw storage bytes, STORED, 64-byte aligned), version (or
// .data/version), optionally byteorder, .format_version, .storage_alignment,
// .data/serialization_id. Legacy (pre-1.6, non-zip) files are refused with a FormatError
// that says so.
//
// Opening reads the end records, central directory and local headers of the zip, the
// `version` and `byteorder` records and data.pkl (parsed with pickle::read_pickle), then
// finds every tensor node of the tree:
//   REDUCE(torch._utils._rebuild_tensor_v2, (pid, storage_offset, size, stride,
//          requires_grad, backward_hooks[, metadata]))
//   REDUCE(torch._utils._rebuild_tensor_v3, (pid, storage_offset, size, stride,
//          requires_grad, backward_hooks, dtype[, metadata]))
//   REDUCE(torch._utils._rebuild_parameter, (tensor, requires_grad, backward_hooks))
//   REDUCE(torch._utils._rebuild_parameter_with_state, (tensor, requires_grad, hooks, state))
// with pid = ('storage', <storage type global>, key, location, numel). Storage bytes are
// never copied at open: a TensorInfo holds the byte range of its storage record in the
// source. Any location is accepted (a "cuda:0" tensor reads as CPU bytes).
//
// Byte order: a file whose `byteorder` record is "big" opens; its tensors have
// big_endian = true. for_each_run() yields the stored (big-endian) bytes;
// read_tensor() byte-swaps each element (each half of a complex) to little-endian.
//
// Errors: FormatError naming the source, the record or tensor, and expected vs found, for
// anything malformed: missing records, unknown storage types, a storage record shorter
// than the pid says, a view reaching outside its storage, negative sizes/strides/offsets.
// Objects shardpoint does not know stay in the tree untouched (kObject / kGlobal).
//
// Thread-safety: a TorchFile is immutable after open; const methods may be called from
// many threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/byte_stream.h"
#include "shardpoint/dtype.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/zip_reader.h"

namespace shardpoint::torchfile {

// One tensor node of the tree (a tensor, or a Parameter wrapping one).
struct TensorInfo {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements
  std::int64_t storage_offset = 0;    // in elements
  std::string storage_key;            // "0", "1", ...; tensors sharing a storage share it
  std::string location;               // "cpu", "cuda:0", ... as saved
  bool requires_grad = false;
  bool is_parameter = false;  // node is a _rebuild_parameter* call
  bool big_endian = false;    // the file's byteorder record says "big"
  // The whole storage record data/<key>: byte range in the source, and its size in
  // elements of dtype (storage.size / itemsize).
  ByteRange storage;
  std::uint64_t storage_numel = 0;
  const pickle::Value* node = nullptr;  // the tensor node in root()'s tree

  std::uint64_t numel() const;
  std::uint64_t nbytes() const { return numel() * dtype_itemsize(dtype); }
  // True when strides are the row-major contiguous strides of shape (size-1 dims ignored).
  bool is_contiguous() const;
};

class TorchFile {
 public:
  // Maps the file at path and opens it. Throws StorageError (missing, unreadable) or
  // FormatError (not a torch.save zip file, or malformed).
  static std::unique_ptr<TorchFile> open(const std::string& path);
  // Opens a torch.save archive held in source (a whole file or a window, e.g. one blob of
  // a .distcp file). Takes ownership of the source.
  static std::unique_ptr<TorchFile> open(std::unique_ptr<ByteSource> source);

  TorchFile(const TorchFile&) = delete;
  TorchFile& operator=(const TorchFile&) = delete;

  const ByteSource& source() const { return *source_; }
  const ZipArchive& archive() const { return *archive_; }
  // The folder name every record starts with ("archive", "my_model", ...).
  const std::string& archive_name() const { return archive_name_; }
  // The integer in the version (or .data/version) record.
  std::int64_t version() const { return version_; }
  bool big_endian() const { return big_endian_; }
  // The record "<archive>/<name>", or nullptr.
  const ZipEntry* record(std::string_view name) const;

  // The unpickled data.pkl. Keep the TorchFile alive while using nodes (value.h: cycles).
  const pickle::ValuePtr& root() const { return root_; }
  // Every tensor node, in depth-first order of first encounter in the tree.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The tensor for a node of root()'s tree, or nullptr when the node is not a tensor.
  const TensorInfo* tensor_of(const pickle::Value& node) const;
  // Storage records by key: byte range of data/<key> in the source.
  const std::unordered_map<std::string, ByteRange>& storages() const { return storages_; }

  // Zero-copy view of a storage record when the source is mapped, else nullopt.
  std::optional<ByteSpan> storage_view(const TensorInfo& info) const;
  // Copies the tensor's elements, row-major, into out, byte-swapped to little-endian when
  // the file is big-endian. REQUIRES out.size() == info.nbytes(). Throws StorageError on a
  // failed read.
  void read_tensor(const TensorInfo& info, std::span<std::byte> out) const;

 private:
  explicit TorchFile(std::unique_ptr<ByteSource> source);
  void parse();
  void find_tensors();
  const TensorInfo* add_tensor(const pickle::Value& node);

  std::unique_ptr<ByteSource> source_;
  std::unique_ptr<ZipArchive> archive_;
  std::string archive_name_;
  std::int64_t version_ = 0;
  bool big_endian_ = false;
  std::string pickle_copy_;  // data.pkl bytes when the source cannot give a view
  pickle::ValuePtr root_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<const pickle::Value*, std::size_t> by_node_;
  std::unordered_map<std::string, ByteRange> storages_;
};

// Calls fn(source_offset, nbytes) for the tensor's elements in row-major order, as byte
// runs of the source: dims whose strides are contiguous are merged into one run, and
// consecutive runs that touch are merged. A 0-dim tensor is one run of itemsize bytes; a
// tensor with no elements makes no call. Bytes are as stored (see big_endian).
void for_each_run(const TensorInfo& info, const std::function<void(std::uint64_t, std::uint64_t)>& fn);

// The dtype a storage type global names ("FloatStorage" -> float32), or nullopt for
// UntypedStorage and names that are not storage types.
std::optional<DType> dtype_of_storage_type(std::string_view name);

}  // namespace shardpoint::torchfile
