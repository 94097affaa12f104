// The zstd codec of items (zstd_reader.h, zstd_writer.h, stream_transform.h): descriptors
// parsed as PyTorch's registry does (any 1.x version; anything else refused by name, as is a
// chain); a frame ZstdWriter writes reads back byte for byte whatever the read sizes, with
// skip(); the stored bytes cut at every shorter length, a flipped byte, bytes after the
// frame and a non-zstd item each throw one FormatError line naming the item.
#include "format/zstd_reader.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace shardpoint::format
