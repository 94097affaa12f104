#include "engine/block_pieces.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/byte_io.h"
#include "core/checksum.h"
#include "engine/block_checksum.h"
#include "engine/chunking.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

std::string encode_block_pieces(const std::vector<BlockPiece>& pieces) {
  std::string out;
  put_le<std::uint64_t>(out, pieces.size());
  for (const BlockPiece& p : pieces) {
    put_le<std::uint32_t>(out, static_cast<std::uint32_t>(p.file.size()));
    out += p.file;
    put_le<std::uint64_t>(out, p.blob_offset);
    put_le<std::uint64_t>(out, p.begin);
    put_le<std::uint64_t>(out, p.end);
    put_le<std::uint32_t>(out, p.crc);
  }
  return out;
}

void decode_block_pieces(std::string_view bytes, std::string_view what, std::vector<BlockPiece>& out) {
  ByteCursor c(as_bytes(bytes));
  const std::uint64_t n = c.read_le<std::uint64_t>(what);
  for (std::uint64_t i = 0; i < n; ++i) {
    BlockPiece p;
    const std::uint32_t len = c.read_le<std::uint32_t>(what);
    p.file = std::string(as_chars(c.read_bytes(len, what)));
    p.blob_offset = c.read_le<std::uint64_t>(what);
    p.begin = c.read_le<std::uint64_t>(what);
    p.end = c.read_le<std::uint64_t>(what);
    p.crc = c.read_le<std::uint32_t>(what);
    out.push_back(std::move(p));
  }
  if (!c.at_end())
    throw FormatError(std::string(what) + ": " + std::to_string(c.remaining()) + " bytes after the pieces");
}

void verify_block_pieces(const std::vector<BlockPiece>& mine, const std::vector<BlockPiece>& everyone,
                         const ChecksumSidecar& sidecar,
                         const std::function<std::shared_ptr<const ByteSource>(const std::string&)>& source,
                         ReadCounts& counts) {
  const std::uint64_t block = sidecar.block_size();
  if (mine.empty() || block == 0) return;
  using BlockKey = std::tuple<std::string, std::uint64_t, std::uint64_t>;  // file, blob offset, block
  std::map<BlockKey, std::vector<const BlockPiece*>> by_block;
  for (const BlockPiece& p : everyone) by_block[{p.file, p.blob_offset, p.begin / block}].push_back(&p);

  std::set<BlockKey> checked;
  std::vector<std::byte> scratch;
  for (const BlockPiece& m : mine) {
    const BlockKey key{m.file, m.blob_offset, m.begin / block};
    if (!checked.insert(key).second) continue;
    const ItemChecksums* entry = sidecar.find(m.file, m.blob_offset);
    const std::uint64_t b = std::get<2>(key);
    if (entry == nullptr || b >= entry->blocks.size()) {
      throw FormatError(m.file + ": blob at offset " + std::to_string(m.blob_offset) +
                        ": checksum sidecar has no block " + std::to_string(b));
    }
    const std::uint64_t b_begin = b * block;
    const std::uint64_t b_end = std::min(b_begin + block, entry->length);
    const std::vector<const BlockPiece*>& candidates = by_block[key];
    // Cover the block left to right: the longest piece that starts where the cover ends;
    // where none does, read the bytes up to the next piece.
    std::uint32_t crc = 0;
    for (std::uint64_t pos = b_begin; pos < b_end;) {
      const BlockPiece* best = nullptr;
      std::uint64_t next = b_end;
      for (const BlockPiece* q : candidates) {
        if (q->end > b_end || q->begin >= q->end) continue;
        if (q->begin == pos) {
          if (best == nullptr || q->end > best->end) best = q;
        } else if (q->begin > pos) {
          next = std::min(next, q->begin);
        }
      }
      if (best != nullptr) {
        crc = crc32c_combine(crc, best->crc, best->end - best->begin);
        pos = best->end;
        continue;
      }
      scratch.resize(static_cast<std::size_t>(next - pos));
      source(m.file)->read(m.blob_offset + pos, scratch, m.file + ": item \"" + entry->fqn + "\" checksum block");
      counts.data_bytes += scratch.size();
      crc = crc32c(crc, scratch);
      pos = next;
    }
    if (crc != entry->blocks[b]) {
      std::string where = m.file + ": item \"" + entry->fqn + "\"";
      if (entry->chunk_offsets) where += " chunk at " + shape_to_string(*entry->chunk_offsets);
      throw FormatError(
          block_checksum_mismatch(where, ChecksumAlgorithm::kCrc32c, b, b_begin, b_end, entry->blocks[b], crc));
    }
  }
}

}  // namespace shardpoint::engine
