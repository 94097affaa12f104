// Reading the header of a safetensors file (the Hugging Face format; the layout is in
// safetensors_writer.h): what tensors the file holds and where each one's bytes are.
//
// Hostile-input safe: every length and offset read from the file is checked against the
// bytes that are there before it is used, the JSON is parsed with a nesting limit, and a
// refusal is one FormatError naming the file (and the tensor where there is one) with
// expected vs found. Checked: the 8-byte length fits the file and kMaxHeaderBytes; the
// header is a JSON object whose entries are {"dtype", "shape", "data_offsets"} with a dtype
// shardpoint knows, non-negative integer dims, begin <= end inside the data, end - begin
// equal to the shape's volume times the dtype's size; no two tensors' bytes overlap;
// `__metadata__` is an object of strings. Gaps between tensors are allowed (the format
// does not forbid them; PyTorch and the safetensors library write none).
//
// DCP's safetensors files (HuggingFaceStorageWriter, FileSystemWriter with
// SerializationFormat.SAFETENSORS) add to `__metadata__`: "DCP_SHARDING_INFO" (a JSON
// string: {fqn: {"saved_offsets": [..]}}, where each tensor is in the full tensor),
// "DCP_VERSION" ("1.0") and "format" ("pt") (docs/dcp-format.md §9).
//
// Thread-safety: pure functions; read_safetensors_header reads through a const source.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/byte_stream.h"
#include "shardpoint/dtype.h"
#include "shardpoint/metadata.h"

namespace shardpoint::format {

// The safetensors library's own limit on the header (its MAX_HEADER_SIZE): no real file
// comes near it, and it bounds what a lying length can make us allocate.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// "__metadata__" keys DCP writes (torch/distributed/checkpoint/_hf_utils.py).
inline constexpr std::string_view kDcpShardingInfoKey = "DCP_SHARDING_INFO";
inline constexpr std::string_view kDcpVersionKey = "DCP_VERSION";

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  std::uint64_t begin = 0;  // data_offsets, relative to the start of the data
  std::uint64_t end = 0;
  bool operator==(const SafetensorsTensor&) const = default;
};

struct SafetensorsHeader {
  std::uint64_t header_bytes = 0;          // N, the JSON's length (padding included)
  std::vector<SafetensorsTensor> tensors;  // in the order the header lists them
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::size_t, std::less<>> by_name;  // name -> position in tensors
  // Where the data starts, relative to the header's first byte (the length prefix).
  std::uint64_t data_start() const { return 8 + header_bytes; }
  // The tensor named `name`, or nullptr.
  const SafetensorsTensor* find(std::string_view name) const;
};

// The DType a safetensors dtype string names ("F32", "BF16", "BOOL", "F8_E4M3", ...), the
// inverse of safetensors_dtype(); nullopt for one shardpoint has no DType for.
std::optional<DType> dtype_from_safetensors(std::string_view name);

// Parses the JSON header `json` (N bytes) of a file whose data part holds `data_bytes`
// bytes. `file` starts every message. Throws FormatError (above).
SafetensorsHeader parse_safetensors_header(std::string_view json, std::uint64_t data_bytes, std::string_view file);

// Reads and parses the header of the safetensors blob at `offset` of `source` (0 for a
// whole file); its data may run to the end of the source. Reads 8 bytes, then the header.
// `file` starts every message. Throws FormatError (also when the source is too short for
// the length prefix or the header length reaches past its end), StorageError on I/O.
SafetensorsHeader read_safetensors_header(const ByteSource& source, std::uint64_t offset, std::string_view file);

// DCP_SHARDING_INFO of a header: fqn -> saved_offsets (where the tensor starts in the full
// tensor); empty when the header has none. Throws FormatError when it is not the JSON DCP
// writes, names a tensor the header lacks, or gives offsets of the wrong rank.
std::map<std::string, Shape> dcp_sharding_info(const SafetensorsHeader& header, std::string_view file);

}  // namespace shardpoint::format
