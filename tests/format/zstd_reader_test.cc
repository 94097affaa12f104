// The zstd codec of items (zstd_reader.h, zstd_writer.h, stream_transform.h): descriptors
// parsed as PyTorch's registry does (any 1.x version; anything else refused by name, as is a
// chain); a frame ZstdWriter writes reads back byte for byte whatever the read sizes, with
// skip(); the stored bytes cut at every shorter length, a flipped byte, bytes after the
// frame and a non-zstd item each throw one FormatError line naming the item.
#include "format/zstd_reader.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <string>

#include "format/stream_transform.h"
#include "format/zstd_writer.h"
#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

std::string compressed(const std::string& data, int level = 3) {
  StringSink out;
  ZstdWriter w(out, level);
  w.write(as_bytes(data));
  w.finish();
  return out.str();
}

std::string payload(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7919) % 251 + (i / 4096) % 3);
  return s;
}

std::string read_all(const std::string& stored, std::size_t step) {
  auto src = std::make_shared<MemorySource>(as_bytes(stored), "f");
  ZstdReader r(src, 0, stored.size(), "item \"x\"");
  std::string out;
  std::string buf(step, '\0');
  while (std::size_t n = r.read_some(std::as_writable_bytes(std::span<char>(buf)))) out.append(buf.data(), n);
  EXPECT_TRUE(r.done());
  return out;
}

void expect_format_error(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error, expected: " << part;
  } catch (const FormatError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(part), std::string::npos) << what;
    EXPECT_NE(what.find("item \"x\""), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(StreamTransformTest, ParsesPyTorchsZstdDescriptorsAndRefusesOthersByName) {
  EXPECT_EQ(parse_transforms({}, "w"), StreamTransform::kNone);
  EXPECT_EQ(parse_transforms({"stream.zstd/1"}, "w"), StreamTransform::kZstd);
  EXPECT_EQ(parse_transforms({"stream.zstd/1.2"}, "w"), StreamTransform::kZstd);
  EXPECT_EQ(transform_descriptors(StreamTransform::kZstd), std::vector<std::string>{"stream.zstd/1"});
  EXPECT_TRUE(transform_descriptors(StreamTransform::kNone).empty());
  for (const std::string d : {"stream.zstd/2", "stream.zstd", "stream.lz4/1", "zstd", ""}) {
    try {
      (void)parse_transforms({d}, "item \"w\"");
      ADD_FAILURE() << d;
    } catch (const FormatError& e) {
      EXPECT_EQ(std::string(e.what()),
                "item \"w\": unknown stream transform \"" + d + "\" (this build undoes \"stream.zstd/1\")");
    }
  }
  EXPECT_THROW((void)parse_transforms({"stream.zstd/1", "stream.zstd/1"}, "w"), FormatError);
}

TEST(ZstdReaderTest, RoundTripsAtAnyReadSizeAndSkips) {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{3} << 20}) {
    const std::string data = payload(n), stored = compressed(data);
    for (const std::size_t step : {std::size_t{1} << 20, std::size_t{4093}})
      EXPECT_EQ(read_all(stored, step), data) << n;
  }
  const std::string data = payload(std::size_t{1} << 20), stored = compressed(data, 19);
  auto src = std::make_shared<MemorySource>(as_bytes(stored), "f");
  ZstdReader r(src, 0, stored.size(), "x");
  std::uint64_t seen = 0;
  r.on_stored([&](std::uint64_t at, ByteSpan b) {
    EXPECT_EQ(at, seen);
    seen += b.size();
  });
  r.skip(500000);
  std::string got(100, '\0');
  r.read_exact(std::as_writable_bytes(std::span<char>(got)));
  EXPECT_EQ(got, data.substr(500000, 100));
  EXPECT_EQ(r.position(), 500100u);
  EXPECT_EQ(r.drain(), data.size());
  EXPECT_EQ(seen, stored.size());
}

TEST(ZstdReaderTest, DamagedFramesThrowOneLineNamingTheItem) {
  const std::string data = payload(20000), stored = compressed(data);
  for (std::size_t cut = 0; cut < stored.size(); ++cut) {
    expect_format_error([&] { read_all(stored.substr(0, cut), 1 << 16); }, cut == 0 ? "truncated" : "");
  }
  std::string flipped = stored;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x40);
  expect_format_error([&] { read_all(flipped, 1 << 16); }, "corrupt zstd data");
  expect_format_error([&] { read_all(stored + compressed("more"), 1 << 16); }, "more stored bytes after it");
  expect_format_error([&] { read_all(std::string(64, 'x'), 1 << 16); }, "corrupt zstd data");
  // Fewer bytes than asked for.
  auto src = std::make_shared<MemorySource>(as_bytes(stored), "f");
  ZstdReader r(src, 0, stored.size(), "item \"x\"");
  expect_format_error([&] { r.skip(data.size() + 1); }, "zstd frame ends after 20000 bytes, 20001 needed");
}

// Bytes that compress into matches at every distance up to max_back: random 64-byte runs,
// each followed by a copy of 64 bytes from up to max_back bytes back.
std::string matchy(std::size_t n, std::size_t max_back = 1000) {
  std::string s;
  s.reserve(n + 128);
  std::uint64_t x = 88172645463325252ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  while (s.size() < n) {
    for (int i = 0; i < 64; ++i) s.push_back(static_cast<char>(next() & 0xff));
    const std::size_t back = 64 + next() % std::min<std::size_t>(s.size() - 63, max_back - 64);
    for (int i = 0; i < 64; ++i) s.push_back(s[s.size() - back]);
  }
  s.resize(n);
  return s;
}

// A frame with a 1 KiB window (so 1 KiB blocks: many blocks and window switches in a small
// payload), with its content size in the header when asked.
std::string small_window_frame(const std::string& data, bool content_size) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
  ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, 10);
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, content_size ? 1 : 0);
  std::string out(ZSTD_compressBound(data.size()), '\0');
  const std::size_t n = ZSTD_compress2(c, out.data(), out.size(), data.data(), data.size());
  ZSTD_freeCCtx(c);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// Reads `stored` as the pieces `sizes` (the last one takes the rest), each in place into its
// own buffer (all kept until the end, as read_into requires); checks what `produced` saw.
std::string read_pieces(const std::string& stored, const std::vector<std::size_t>& sizes, std::size_t total,
                        std::uint64_t* in_place = nullptr) {
  auto src = std::make_shared<MemorySource>(as_bytes(stored), "f");
  ZstdReader r(src, 0, stored.size(), "item \"x\"");
  std::vector<std::string> buffers;
  std::string out;
  for (std::size_t i = 0; i <= sizes.size(); ++i) {
    const std::size_t n = i < sizes.size() ? sizes[i] : total - out.size();
    std::string& buf = buffers.emplace_back(n, '\0');
    const std::span<std::byte> span = std::as_writable_bytes(std::span<char>(buf));
    std::size_t seen = 0;
    const std::size_t got = r.read_into(
        span,
        [&](ByteSpan b) {
          EXPECT_EQ(b.data(), span.data() + seen);
          seen += b.size();
        },
        /*in_place=*/true);
    EXPECT_EQ(got, n);
    EXPECT_EQ(seen, got);
    out.append(buf.data(), got);
  }
  EXPECT_TRUE(r.done());
  EXPECT_EQ(r.position(), total);
  if (in_place != nullptr) *in_place = r.in_place_bytes();
  return out;
}

TEST(ZstdReaderTest, InPlaceReadsMatchAtEverySplit) {
  // PyTorch's kind of frame (streamed, 2 MiB window, no content size) and small-window frames
  // with and without their content size.
  const std::string big = matchy(std::size_t{12} << 20, std::size_t{2} << 20), small = matchy(300000);
  const std::string big_frame = compressed(big);
  for (const auto& [data, stored] : std::vector<std::pair<const std::string*, std::string>>{
           {&big, big_frame}, {&small, small_window_frame(small, true)}, {&small, small_window_frame(small, false)}}) {
    const std::size_t n = data->size();
    const std::size_t w = n > 1000000 ? std::size_t{2} << 20 : 1024, b = n > 1000000 ? std::size_t{128} << 10 : 1024;
    for (const std::vector<std::size_t>& sizes :
         std::vector<std::vector<std::size_t>>{{},          // one buffer: the whole frame in place
                                               {1, w + b},  // from the window buffer into a long one
                                               {5000, w + b - 1, w + b, 3 * w + 17,
                                                1},  // just short of a window and block, then enough
                                               {w + b + 3, 1, 2 * w + 2 * b, 700,
                                                333},  // in place, back, in place, back
                                               {3 * b, 3 * b, 3 * b, 3 * b,
                                                3 * b}})  // longer than a block, shorter than a window
    {
      std::uint64_t in_place = 0;
      EXPECT_EQ(read_pieces(stored, sizes, n, &in_place), *data) << n << " " << sizes.size();
      EXPECT_GT(in_place, 0u);
      EXPECT_LT(in_place, n + 1);
    }
  }
  // Pieces too short to hold a window are copied out of the window buffer.
  std::uint64_t in_place = 1;
  EXPECT_EQ(read_pieces(big_frame, std::vector<std::size_t>(120, std::size_t{100} << 10), big.size(), &in_place), big);
  EXPECT_EQ(in_place, 0u);
  // Skips between in-place reads.
  auto src = std::make_shared<MemorySource>(as_bytes(big_frame), "f");
  ZstdReader r(src, 0, big_frame.size(), "x");
  std::string a(std::size_t{3} << 20, '\0'), b(std::size_t{10} << 20, '\0');
  r.skip(123457);
  ASSERT_EQ(r.read_into(std::as_writable_bytes(std::span<char>(a)), {}, true), a.size());
  r.skip(99);
  ASSERT_EQ(r.read_into(std::as_writable_bytes(std::span<char>(b)), {}, true), big.size() - a.size() - 123457 - 99);
  EXPECT_EQ(a, big.substr(123457, a.size()));
  EXPECT_EQ(b.substr(0, big.size() - a.size() - 123457 - 99), big.substr(123457 + a.size() + 99));
  EXPECT_TRUE(r.done());
}

// Rewrites the content size in a frame header that has a 4-byte one (FHD flag 2).
std::string with_content_size(std::string frame, std::uint32_t size) {
  const unsigned fhd = static_cast<unsigned char>(frame[4]);
  EXPECT_EQ(fhd >> 6, 2u);
  const std::size_t at = 5 + ((fhd & 0x20) != 0 ? 0 : 1) + (fhd & 3);  // after the window and dictionary fields
  for (int i = 0; i < 4; ++i) frame[at + static_cast<std::size_t>(i)] = static_cast<char>((size >> (8 * i)) & 0xff);
  return frame;
}

TEST(ZstdReaderTest, FramesThatLieOrEndEarlyAreRefusedInPlaceToo) {
  const std::string data = matchy(200000);
  for (const bool content_size : {true, false}) {
    const std::string stored = small_window_frame(data, content_size);
    for (std::size_t cut = 0; cut < stored.size(); cut += cut < 200 ? 1 : 97) {
      expect_format_error([&] { read_pieces(stored.substr(0, cut), {}, data.size()); }, cut == 0 ? "truncated" : "");
    }
  }
  // A content size larger or smaller than what the frame decompresses to: libzstd's check at
  // the frame's end (or a block that no longer fits) refuses it, whichever way it is read.
  const std::string stored = small_window_frame(data, true);
  for (const std::uint32_t lie : {200000u - 1000u, 200000u + 1000u, 200000u - 1u, 200000u + 1u}) {
    const std::string lying = with_content_size(stored, lie);
    expect_format_error([&] { read_pieces(lying, {}, data.size()); }, "corrupt zstd data");
    expect_format_error([&] { read_all(lying, 1 << 16); }, "corrupt zstd data");
  }
  // A single-segment frame (its window is its content size) reads back.
  std::string single(ZSTD_compressBound(4000), '\0');
  single.resize(ZSTD_compress(single.data(), single.size(), data.data(), 4000, 3));
  EXPECT_EQ(read_all(single, 1000), data.substr(0, 4000));
  // Windows larger than libzstd's default limit, and skippable frames, are refused by name.
  std::string huge = single;
  huge[4] = static_cast<char>(huge[4] & ~0x20);          // no single segment: a window descriptor follows
  huge.insert(5, 1, static_cast<char>((28 - 10) << 3));  // 2^28
  expect_format_error([&] { read_all(huge, 1000); }, "window of 268435456 bytes");
  const std::string skippable("\x50\x2a\x4d\x18\x04\x00\x00\x00"
                              "abcd",
                              12);
  expect_format_error([&] { read_all(skippable, 1000); }, "skippable frame");
}

}  // namespace
}  // namespace shardpoint::format
