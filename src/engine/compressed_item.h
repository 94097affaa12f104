// Items stored through a stream transform (zstd, docs/dcp-format.md §2.4), seen as the
// torch.save blob they decompress to.
//
// A zstd item has no index: a byte at decompressed offset N is reached by decompressing
// from the start. decompress_item() makes one pass over the whole item and returns its
// image: the whole blob when it is small (or when asked), else only its head and its tail
// (the zip records, data.pkl and the central directory: everything the torch.save parser
// reads) with a hole where the tensor data lies. The hole's bytes are dropped as they
// stream past; their CRC-32 is kept, so the caller checks them against the zip record.
// A caller that knows where its bytes lie gets them during that pass
// (DecompressOptions::locate/deliver): decompressed straight into its buffers, where they
// are long enough to hold the frame's window, else copied out; read_decompressed() makes a
// second pass that decompresses into the caller's buffers the ranges it wants and stops
// after the last one.
// Memory stays bounded by the constants in the .cc (a few MiB) whatever the item's size,
// except where the whole image is asked for.
//
// Thread-safety: free functions; the file source must allow concurrent reads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardpoint/byte_stream.h"
#include "shardpoint/metadata.h"
#include "torchfile/zip_reader.h"

namespace shardpoint::engine {

// One range the caller wants: `length` bytes at decompressed offset `at` (relative to a
// base, see DecompressOptions::locate) into `out`.
struct WantedRange {
  std::uint64_t at = 0;
  std::uint64_t length = 0;
  std::byte* out = nullptr;
};

struct DecompressOptions {
  // FormatError when the item decompresses to more bytes (stops decompression bombs).
  std::uint64_t max_bytes = 0;
  // Hold the whole image when the item decompresses to at most this many bytes.
  std::uint64_t keep_whole_bytes = 0;
  // Sees every run of stored bytes as it is read (ZstdReader::on_stored).
  std::function<void(std::uint64_t at, ByteSpan bytes)> on_stored;
  // Delivers in passing: once the first 64 KiB are decompressed, locate(them) may name a
  // base offset; every `deliver` range (sorted by at, disjoint) at base + at is then
  // written to its buffer as its bytes stream past (the buffers must not change until
  // decompress_item returns: they are the decompressor's window). The caller checks
  // afterwards that the base was right (DecompressedItem::delivered_base) and reads again
  // if not; a range the frame ends inside is left partly unspecified.
  std::function<std::optional<std::uint64_t>(ByteSpan head)> locate;
  std::span<const WantedRange> deliver;
};

struct DecompressedItem {
  // The decompressed blob: size() is its full size. Reads inside `hole` throw FormatError.
  std::shared_ptr<const ByteSource> image;
  // The bytes not held (nullopt: all held) and their CRC-32.
  std::optional<torchfile::ByteRange> hole;
  std::uint32_t hole_crc = 0;
  // The base the deliver ranges were copied at (nullopt: none copied).
  std::optional<std::uint64_t> delivered_base;
  // How many delivered bytes were decompressed straight into their ranges (no copy).
  std::uint64_t in_place_bytes = 0;
};

// The data offset of the first storage record ("<archive>/data/<key>") whose local header
// lies in `head`, the start of a torch.save blob; nullopt when none does. A guess (it scans
// for the header signature): the parsed archive confirms it.
std::optional<std::uint64_t> first_data_record_offset(ByteSpan head);

// Decompresses the item `info` of `file` (a source over the whole .distcp file) in one pass.
// REQUIRES info names one zstd transform (format::parse_transforms). `label` names the item
// in errors and in the image's name. Throws FormatError (range outside the file, corrupt,
// truncated or oversized data, bytes after the frame), StorageError.
DecompressedItem decompress_item(const std::shared_ptr<const ByteSource>& file, const format::StorageInfo& info,
                                 const std::string& label, const DecompressOptions& options);

// The CRC-32 of the decompressed bytes [begin, end): from the image, with the hole's CRC-32
// combined in when the range covers the hole; nullopt when it holds only part of the hole.
// REQUIRES end <= image size.
std::optional<std::uint32_t> decompressed_crc32(const DecompressedItem& item, std::uint64_t begin, std::uint64_t end);

// Throws FormatError "<label>: the decompressed item has N bytes after the end of its zip
// archive" (or "does not end with a zip end record") unless the image ends exactly with the
// end-of-central-directory record torch.save writes last (no comment): a frame that
// decompresses to more bytes than the blob holds is refused.
void check_ends_with_zip_end(const DecompressedItem& item, const std::string& label);

// A source that owns a reference to `image` (for parsers that take ownership).
std::unique_ptr<ByteSource> owning_source(std::shared_ptr<const ByteSource> image);

// Decompresses the item again and writes the `wanted` ranges (sorted by `at`, not
// overlapping; their buffers unchanged until it returns) into their buffers, long ones
// decompressed in place; bytes at or past image.hole's end are copied from the image. Decompresses only up to the last
// byte it needs unless `to_end` (then to the end of the frame, so on_stored sees every stored byte). Throws as
// decompress_item.
void read_decompressed(const std::shared_ptr<const ByteSource>& file, const format::StorageInfo& info,
                       const std::string& label, const DecompressedItem& image, std::span<const WantedRange> wanted,
                       bool to_end, const std::function<void(std::uint64_t at, ByteSpan bytes)>& on_stored = {});

}  // namespace shardpoint::engine
