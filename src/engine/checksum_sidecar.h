// The checksum sidecar `.shardpoint-checksums.json` (kChecksumSidecar): per-item and
// per-block checksums of every blob a shardpoint save wrote. PyTorch ignores the file; a
// checkpoint without it (written by PyTorch) simply loads unverified.
//
// Persisted layout (JSON, UTF-8; field meanings never change, new fields may be added and
// readers ignore fields they do not know):
//   {
//     "format": "shardpoint-checksums",   // identifies the file
//     "version": 1,                       // bumped only for changes old readers must refuse
//     "algorithm": "crc32c",              // "crc32c" (Castagnoli, init 0) or "xxh3" (XXH3-64,
//                                         // seed 0); names never change
//     "block_size": 1048576,              // bytes per block, > 0
//     "items": [                          // sorted by (file, offset)
//       { "file": "__0_0.distcp",         // _StorageInfo.relative_path
//         "offset": 0, "length": 1187,    // the blob's byte range in that file
//         "fqn": "model.w",               // the item, for messages
//         "chunk_offsets": [0, 0],        // tensor chunk offsets; absent for bytes items
//         "checksum": "1a2b3c4d",         // over the whole blob [offset, offset+length)
//         "blocks": ["...", ...] }        // block i covers blob bytes
//     ]                                   // [i*block_size, min((i+1)*block_size, length))
//   }
// Checksum values are lowercase hex strings: 8 digits for crc32c, 16 for xxh3.
//
// Written by the coordinator with write_atomic before `.metadata`; never rewritten.
// Thread-safety: plain values; the functions are reentrant.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardpoint/checkpoint.h"
#include "shardpoint/metadata.h"

namespace shardpoint::engine {

struct ItemChecksums {
  std::string file;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::string fqn;
  std::optional<format::Shape> chunk_offsets;
  std::uint64_t checksum = 0;
  std::vector<std::uint64_t> blocks;
  bool operator==(const ItemChecksums&) const = default;
};

class ChecksumSidecar {
 public:
  ChecksumSidecar() = default;
  ChecksumSidecar(ChecksumAlgorithm algorithm, std::uint64_t block_size)
      : algorithm_(algorithm), block_size_(block_size) {}

  ChecksumAlgorithm algorithm() const { return algorithm_; }
  std::uint64_t block_size() const { return block_size_; }

  // Adds (or replaces) the entry of item.file at item.offset.
  void add(ItemChecksums item);
  // The entry for the blob at `offset` of `file`, or nullptr.
  const ItemChecksums* find(const std::string& file, std::uint64_t offset) const;
  std::size_t size() const { return items_.size(); }
  const std::map<std::pair<std::string, std::uint64_t>, ItemChecksums>& items() const { return items_; }

  // The JSON above (deterministic).
  std::string encode() const;
  // Parses and checks it: format name, version 1, algorithm, block_size > 0, every item's
  // block count == ceil(length / block_size), hex widths. Throws FormatError naming
  // `source_name` and the field.
  static ChecksumSidecar decode(std::string_view json, std::string_view source_name);

 private:
  ChecksumAlgorithm algorithm_ = ChecksumAlgorithm::kCrc32c;
  std::uint64_t block_size_ = 1;
  std::map<std::pair<std::string, std::uint64_t>, ItemChecksums> items_;
};

}  // namespace shardpoint::engine
