// The checksum blocks a resharding load cuts: each rank reads only part of such a block,
// records what it read as a BlockPiece (its range and crc32c), and after the read phase
// the ranks exchange their pieces (one all_gather) and check every block they touched by
// combining the pieces of all ranks, reading only the parts no rank read. Why this instead
// of smaller blocks: the top of item_reader.cc.
//
// Thread-safety: free functions over values; verify_block_pieces reads through `source`,
// which must be safe to call from the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/checksum_sidecar.h"
#include "shardpoint/byte_stream.h"
#include "shardpoint/checkpoint_reader.h"

namespace shardpoint::engine {

// The part [begin, end) of checksum block begin / block_size of the blob at blob_offset of
// `file` that one rank read, and its crc32c. Blob-relative offsets, as the sidecar's blocks.
struct BlockPiece {
  std::string file;
  std::uint64_t blob_offset = 0;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  std::uint32_t crc = 0;
  bool operator==(const BlockPiece&) const = default;
};

// Binary form of a rank's pieces for the exchange (little-endian, no padding).
std::string encode_block_pieces(const std::vector<BlockPiece>& pieces);
// Appends the decoded pieces to out; throws FormatError naming `what` on malformed input.
void decode_block_pieces(std::string_view bytes, std::string_view what, std::vector<BlockPiece>& out);

// Checks every block that `mine` touch against `sidecar` (crc32c), combining the pieces of
// all ranks (`everyone`, `mine` included) over each block in order; parts of a block that
// no piece covers are read through source(file) and counted in counts.data_bytes. Throws
// FormatError ("<file>: item \"fqn\" ...: checksum mismatch in block b ...") on a mismatch.
void verify_block_pieces(const std::vector<BlockPiece>& mine, const std::vector<BlockPiece>& everyone,
                         const ChecksumSidecar& sidecar,
                         const std::function<std::shared_ptr<const ByteSource>(const std::string&)>& source,
                         ReadCounts& counts);

}  // namespace shardpoint::engine
