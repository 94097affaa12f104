// Checksums of one item blob as it streams out: one value over the whole blob and one per
// fixed-size block of it, so a reader that needs only part of a blob verifies just the
// blocks it touches (checksum_sidecar.h persists them).
//
// Blocks are [i * block_size, min((i + 1) * block_size, length)) of the blob, counted from
// the blob's first byte (not the .distcp file's). The last block may be short; a blob of 0
// bytes has no blocks.
//
// Thread-safety: a BlockChecksummer is single-threaded; the free functions are pure.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/byte_io.h"
#include "core/checksum.h"
#include "shardpoint/checkpoint.h"

namespace shardpoint::engine {

// Default block size of the sidecar: 1 MiB. Costs 8 (crc32c) or 16 (xxh3) hex digits of
// sidecar per MiB of checkpoint. A load that needs part of a block verifies it from the
// crc32c pieces the ranks read (item_reader.h), so the block size does not widen
// resharding loads; a lone reader (CheckpointReader, an xxh3 sidecar) reads the rest.
inline constexpr std::uint64_t kDefaultChecksumBlockSize = std::uint64_t{1} << 20;

// The persisted name ("crc32c", "xxh3", "none"). Existing names never change.
std::string_view checksum_algorithm_name(ChecksumAlgorithm algorithm);
// Inverse of checksum_algorithm_name; throws FormatError naming `source` for other names.
ChecksumAlgorithm checksum_algorithm_from_name(std::string_view name, std::string_view source);

// One-shot checksum of data (crc32c zero-extended to 64 bits; xxh3_64 seed 0; 0 for kNone).
std::uint64_t checksum_of(ChecksumAlgorithm algorithm, ByteSpan data);

// Lowercase hex, 8 digits for crc32c, 16 for xxh3.
std::string checksum_to_hex(ChecksumAlgorithm algorithm, std::uint64_t value);
// Parses checksum_to_hex's output; throws FormatError naming `what`.
std::uint64_t checksum_from_hex(ChecksumAlgorithm algorithm, std::string_view hex, std::string_view what);
// The same, nullopt for anything checksum_from_hex refuses (for callers that build their
// message only on failure).
std::optional<std::uint64_t> parse_checksum_hex(ChecksumAlgorithm algorithm, std::string_view hex);

// "<where>: checksum mismatch in block b (blob bytes [begin, end)): expected <algorithm>
// <hex>, found <hex>": the message of every block checksum mismatch.
std::string block_checksum_mismatch(const std::string& where, ChecksumAlgorithm algorithm, std::uint64_t block,
                                    std::uint64_t begin, std::uint64_t end, std::uint64_t expected,
                                    std::uint64_t found);

// One checksum fed in pieces: crc32c chains, xxh3 streams, kNone stays 0. The value after
// any split of the bytes into update() calls is checksum_of() of all of them.
class StreamingChecksum {
 public:
  explicit StreamingChecksum(ChecksumAlgorithm algorithm);
  void update(ByteSpan data);
  std::uint64_t value() const;
  // Starts over, as if just constructed.
  void reset();

 private:
  ChecksumAlgorithm algorithm_;
  std::uint32_t crc_ = 0;
  std::unique_ptr<Xxh3> xxh3_;
};

class BlockChecksummer {
 public:
  // REQUIRES block_size > 0.
  BlockChecksummer(ChecksumAlgorithm algorithm, std::uint64_t block_size);
  ~BlockChecksummer();
  BlockChecksummer(const BlockChecksummer&) = delete;
  BlockChecksummer& operator=(const BlockChecksummer&) = delete;

  // Continues the current block's checksum with data (and, for xxh3, the whole blob's; the
  // whole-blob crc32c is combined from the blocks' so the bytes are hashed once).
  void update(ByteSpan data);
  // Bytes seen so far.
  std::uint64_t length() const { return length_; }
  // The whole-blob checksum and the per-block ones; call once, after the last update().
  std::uint64_t finish_item();
  std::vector<std::uint64_t> take_blocks();

 private:
  void close_block();

  ChecksumAlgorithm algorithm_;
  std::uint64_t block_size_;
  std::uint64_t length_ = 0;
  std::uint64_t in_block_ = 0;  // bytes of the current block seen
  StreamingChecksum block_;
  std::uint32_t crc_item_ = 0;                    // crc32c: the closed blocks' crcs combined
  std::unique_ptr<StreamingChecksum> xxh3_item_;  // xxh3 only
  std::vector<std::uint64_t> blocks_;
  bool finished_ = false;
};

}  // namespace shardpoint::engine
