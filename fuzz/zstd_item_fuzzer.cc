// Fuzzes zstd items (docs/dcp-format.md §2.4) the way every reader sees them: the input is
// an item's stored bytes. Invariants: decompress_item never crashes and throws only
// FormatError; a head + tail image agrees with the whole image (size, the CRC-32 of the
// hole, and the bytes read_decompressed fills from the stream and from the tail); so do the
// bytes delivered in passing (decompressed in place into one range over the whole image) and
// those ZstdReader::read_into writes in place into pieces whose sizes the input picks; a
// decompressed blob then goes through the torch.save parser, also throwing only FormatError.
// Writer round trip: the input compressed by ZstdWriter decompresses to itself, in place too.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/compressed_item.h"
#include "format/zstd_reader.h"
#include "format/zstd_writer.h"
#include "shardpoint/error.h"
#include "torchfile/torch_file.h"

using namespace shardpoint;

namespace {

// Caps that keep each run small: a bomb stops at 4 MiB, images above 64 KiB keep head + tail.
constexpr std::uint64_t kMaxBytes = std::uint64_t{4} << 20;

void round_trip(ByteSpan input) {
  StringSink stored;
  format::ZstdWriter writer(stored, 1);
  writer.write(input);
  writer.finish();
  auto source = std::make_shared<MemorySource>(as_bytes(stored.str()), "round trip");
  format::ZstdReader reader(source, 0, stored.str().size(), "round trip");
  std::vector<std::byte> back(input.size() + 1);
  const std::size_t n = input.empty() ? 0 : (reader.read_exact(std::span(back.data(), input.size())), input.size());
  if (reader.read_some(std::span(back.data() + n, 1)) != 0 || !reader.done()) std::abort();
  if (n != 0 && std::memcmp(back.data(), input.data(), n) != 0) std::abort();
  format::ZstdReader in_place(source, 0, stored.str().size(), "round trip");
  std::vector<std::byte> whole(input.size() + 1);
  if (in_place.read_into(whole, {}, /*in_place=*/true) != input.size() || !in_place.done()) std::abort();
  if (!input.empty() && std::memcmp(whole.data(), input.data(), input.size()) != 0) std::abort();
}

// The frame read by read_into in place into pieces of sizes taken from the input (each kept
// until the end, as read_into requires); compared with the whole image, then read past its end.
void read_in_pieces(ByteSpan input, const std::shared_ptr<const ByteSource>& file, const ByteSource& whole) {
  format::ZstdReader reader(file, 0, input.size(), "item");
  std::vector<std::vector<std::byte>> pieces;
  std::uint64_t at = 0;
  for (std::size_t i = 0; at < whole.size(); ++i) {
    const std::size_t k = input.empty() ? 0 : std::to_integer<std::size_t>(input[i % input.size()]);
    std::vector<std::byte>& piece =
        pieces.emplace_back(i < 64 ? (k << (k % 13)) + 1 : static_cast<std::size_t>(whole.size() - at));
    const std::size_t n = reader.read_into(piece, {}, /*in_place=*/true);
    std::vector<std::byte> want(n);
    whole.read(at, want, "check");
    if (n == 0 || std::memcmp(piece.data(), want.data(), n) != 0) std::abort();
    at += n;
  }
  // A frame may end after its last byte was produced (an empty frame before any): one more
  // read sees the end.
  std::vector<std::byte> past(1);
  if (reader.read_into(past, {}, /*in_place=*/true) != 0) std::abort();
  if (!reader.done() || reader.position() != whole.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const ByteSpan input(reinterpret_cast<const std::byte*>(data), size);
  round_trip(input);
  auto file = std::make_shared<MemorySource>(input, "fuzz.distcp");
  const format::StorageInfo info{"fuzz.distcp", 0, size, {"stream.zstd/1"}};
  try {
    engine::DecompressOptions options;
    options.max_bytes = kMaxBytes;
    options.keep_whole_bytes = 0;  // head + tail whenever the item is over 64 KiB
    const engine::DecompressedItem sparse = engine::decompress_item(file, info, "item", options);
    options.keep_whole_bytes = kMaxBytes;
    const engine::DecompressedItem whole = engine::decompress_item(file, info, "item", options);
    const std::uint64_t n = whole.image->size();
    if (whole.hole || sparse.image->size() != n || n > kMaxBytes) std::abort();
    if (engine::decompressed_crc32(sparse, 0, n) != engine::decompressed_crc32(whole, 0, n)) std::abort();
    if (sparse.hole) {
      const torchfile::ByteRange& h = *sparse.hole;
      if (h.offset > n || h.size > n - h.offset) std::abort();
      // One range from the stream (inside the hole) and one from the tail.
      std::vector<std::byte> a(16), b(16), want(16);
      const engine::WantedRange wanted[] = {{h.offset + h.size / 2, a.size(), a.data()},
                                            {n - b.size(), b.size(), b.data()}};
      engine::read_decompressed(file, info, "item", sparse, wanted, false);
      for (const engine::WantedRange& r : wanted) {
        whole.image->read(r.at, want, "check");
        if (std::memcmp(r.out, want.data(), want.size()) != 0) std::abort();
      }
    }
    read_in_pieces(input, file, *whole.image);
    if (n > 0) {
      // Everything delivered in passing into one range (base 0).
      std::vector<std::byte> all(n);
      const engine::WantedRange range[] = {{0, n, all.data()}};
      options.keep_whole_bytes = 0;
      options.locate = [](ByteSpan) { return std::optional<std::uint64_t>(0); };
      options.deliver = range;
      const engine::DecompressedItem delivered = engine::decompress_item(file, info, "item", options);
      std::vector<std::byte> want(n);
      whole.image->read(0, want, "check");
      if (delivered.delivered_base != 0 || std::memcmp(all.data(), want.data(), n) != 0) std::abort();
      if (engine::decompressed_crc32(delivered, 0, n) != engine::decompressed_crc32(whole, 0, n)) std::abort();
    }
    torchfile::TorchFile::open(engine::owning_source(whole.image));
  } catch (const FormatError&) {
  }
  return 0;
}
