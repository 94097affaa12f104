// CheckpointListing: the flat view of a checkpoint that `inspect` (and `verify`) print:
// every key in DCP flattening order with either a tensor (dtype, shape, bytes) or an
// object (its Python-like repr), and a way to stream each tensor's elements in row-major
// little-endian order (for --hash), whatever the file format, strides or sharding.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/byte_io.h"
#include "engine/checkpoint_location.h"
#include "shardpoint/dtype.h"
#include "shardpoint/location.h"
#include "shardpoint/zip_crc_counts.h"
#include "torchfile/torch_file.h"

namespace shardpoint::cli {

struct ListingEntry {
  std::string key;
  bool is_tensor = false;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::uint64_t nbytes = 0;
  std::string repr;    // objects
  std::string detail;  // tensors: e.g. "cuda:0", "parameter", "3 chunks"
};

class CheckpointListing {
 public:
  virtual ~CheckpointListing() = default;
  // "torch" or "dcp".
  virtual std::string format() const = 0;
  // One header line for the human listing.
  virtual std::string description() const = 0;
  virtual const std::vector<ListingEntry>& entries() const = 0;
  // Calls fn with consecutive pieces of entry i's elements, row-major, little-endian.
  // REQUIRES entries()[i].is_tensor.
  virtual void stream_tensor(std::size_t i, const std::function<void(ByteSpan)>& fn) const = 0;
  // Extra human text after the key listing (DCP: the chunk layout per rank and file).
  virtual std::string layout_text() const { return {}; }
  // The zip CRC-32 checks of what was read so far (open_listing's check_zip_crc).
  virtual engine::ZipCrcCounts zip_crc_counts() const = 0;
};

// Opens a torch.save file or a DCP folder, by local path or storage URL
// (engine::locate_checkpoint: a URL with `.metadata` under it is DCP, else an object at the
// URL is a torch.save file). check_zip_crc: the zip CRC-32 of every record read is
// checked where no sidecar covers it: a DCP folder's blobs (engine::CheckpointReaderOptions),
// a torch.save file's small records (data.pkl, ...) at open and its storage records as
// stream_tensor reads them (engine/torch_file_crc.h). A mismatch throws FormatError naming
// file, record and byte range (stream_tensor: and the key). Throws FormatError /
// StorageError naming the path or URL.
std::unique_ptr<CheckpointListing> open_listing(const Location& where, bool check_zip_crc = true);

// Implementations, one per format.
std::unique_ptr<CheckpointListing> open_torch_listing(const std::string& path, bool check_zip_crc = true);
// The torch.save file `source` holds (e.g. an object behind a URL), named `name`.
// `open_source` is called once, and once more to name a damaged data.pkl.
std::unique_ptr<CheckpointListing> open_torch_listing(const std::string& name,
                                                      const std::function<std::unique_ptr<ByteSource>()>& open_source,
                                                      bool check_zip_crc = true);
// REQUIRES location.is_folder() (a DCP or Hugging Face folder).
std::unique_ptr<CheckpointListing> open_dcp_listing(const engine::CheckpointLocation& location,
                                                    bool check_zip_crc = true);

// The Python-like repr of `object`, a node of file's tree, with each tensor it holds shown
// as tensor(float32, [2]) (Parameter(...) for a parameter; requires_grad and a device
// other than cpu added) instead of its rebuild call: a bytes item whose object holds
// tensors, or an object of a torch.save file that inspect does not descend into.
std::string object_repr(const pickle::Value& object, const torchfile::TorchFile& file);

// SHA-256 hex of entry i's elements.
std::string tensor_sha256(const CheckpointListing& listing, std::size_t i);

// "zip CRC-32: 12 records checked (1.5 MiB), 1 read only in part (unchecked), 2 written
// without a CRC-32": what a read pass's zip CRC-32 checks found, the parts that are not
// zero; "" when nothing was checked.
std::string zip_crc_text(const engine::ZipCrcCounts& counts);

// Help text for commands that take paths: which URLs are accepted and where each driver
// finds its credentials (one paragraph, ends with a newline).
const char* storage_url_help();

// The `inspect --json` object (ordered keys).
nlohmann::ordered_json listing_to_json(const CheckpointListing& listing, bool with_hash);
// The human listing.
std::string listing_to_text(const CheckpointListing& listing, bool with_hash);

}  // namespace shardpoint::cli
