// SafetensorsWriter: streams one .safetensors file (the Hugging Face format) to a ByteSink,
// tensor after tensor, so memory holds only the header and the caller's current piece.
//
// Layout (https://github.com/huggingface/safetensors, "Format"):
//   8 bytes  little-endian u64 N, the header length
//   N bytes  UTF-8 JSON object: {"__metadata__": {str: str}, NAME: {"dtype": "F32",
//            "shape": [..], "data_offsets": [begin, end]}, ...}, padded with spaces so
//            the data starts at a multiple of 8
//   data     the tensors' row-major little-endian bytes, back to back, in header order;
//            offsets are relative to the start of the data
// The whole header is known up front (names, dtypes, shapes), so it is written first and
// the data follows without seeking.
//
// Thread-safety: single-writer. The sink must outlive the writer.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/byte_stream.h"
#include "shardpoint/dtype.h"

namespace shardpoint::format {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::uint64_t nbytes() const;
};

// The safetensors dtype string ("F32", "BF16", "BOOL", "F8_E4M3", ...), or nullopt for a
// dtype safetensors cannot name (complex, float8 fnuz/e8m0).
std::optional<std::string_view> safetensors_dtype(DType dtype);

// The JSON header for entries in order (without the length prefix, unpadded). Throws
// UsageError for a dtype safetensors cannot name or a duplicate name.
std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata = {});

class SafetensorsWriter {
 public:
  // Writes the length prefix and header at once. Throws as safetensors_header() and what
  // the sink throws.
  SafetensorsWriter(ByteSink& sink, std::vector<SafetensorsEntry> entries,
                    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends data bytes (any split across tensors). Throws UsageError past the declared total.
  void write(ByteSpan data);
  // Throws UsageError unless exactly the declared bytes were written.
  void finish();

  std::uint64_t data_bytes() const { return total_; }

 private:
  ByteSink& sink_;
  std::vector<SafetensorsEntry> entries_;
  std::uint64_t total_ = 0;
  std::uint64_t written_ = 0;
};

}  // namespace shardpoint::format
