// http::WindowedSource (the object-store drivers' lazy source): the bytes of any read are
// the object's, blocks tile the object instead of overlapping, and announced ranges
// (will_need) size the ranged fetches: a lone small item is one small fetch, a run of items
// one window, and a reader ahead fetches the announced bytes a reader behind it needs next.
#include "storage/http/ranged_reads.h"

#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardpoint::storage::http {
namespace {

constexpr std::size_t kWindow = 1 << 16;

struct FakeObject {
  std::string bytes;
  std::mutex mu;
  std::vector<std::pair<std::uint64_t, std::size_t>> fetches;  // (offset, length)

  explicit FakeObject(std::size_t n) : bytes(n, '\0') {
    for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  }
  RangeFetch fetch() {
    return [this](std::uint64_t offset, std::span<std::byte> out) {
      ASSERT_LE(offset + out.size(), bytes.size());
      std::memcpy(out.data(), bytes.data() + offset, out.size());
      std::lock_guard lock(mu);
      fetches.emplace_back(offset, out.size());
    };
  }
  std::uint64_t fetched_bytes() const {
    std::uint64_t n = 0;
    for (const auto& f : fetches) n += f.second;
    return n;
  }
};

std::string read(const WindowedSource& source, std::uint64_t offset, std::size_t n) {
  std::string out(n, '\0');
  source.read(offset, std::as_writable_bytes(std::span(out)), "test read");
  return out;
}

TEST(WindowedSourceTest, ReadsReturnTheObjectsBytes) {
  FakeObject object(5 * kWindow + 321);
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch());
  const std::vector<std::pair<std::uint64_t, std::size_t>> reads = {{0, 8},
                                                                    {100, 4000},
                                                                    {kWindow - 4, 8},
                                                                    {kWindow / 2, kWindow},
                                                                    {3 * kWindow + 5, 2 * kWindow},
                                                                    {object.bytes.size() - 10, 10},
                                                                    {7, 0},
                                                                    {2 * kWindow - 1, 3}};
  for (const auto& [offset, n] : reads) {
    EXPECT_EQ(read(source, offset, n), object.bytes.substr(offset, n)) << offset << " +" << n;
  }
}

TEST(WindowedSourceTest, StreamingReadsTileTheObject) {
  FakeObject object(8 * kWindow);
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch());
  source.will_need(0, object.bytes.size());
  // Reads that straddle block ends (3000 does not divide the window).
  for (std::uint64_t at = 0; at < object.bytes.size(); at += 3000) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(3000, object.bytes.size() - at));
    ASSERT_EQ(read(source, at, n), object.bytes.substr(at, n));
  }
  EXPECT_EQ(object.fetched_bytes(), object.bytes.size());  // no byte twice
  EXPECT_EQ(object.fetches.size(), 8u);                    // whole windows
}

TEST(WindowedSourceTest, AnnouncedSmallItemsAreSmallFetches) {
  FakeObject object(16 * kWindow);
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch());
  // Three small items far apart (a replicated `step` per parameter in another rank's file),
  // each read as its end records, then its head.
  const std::vector<std::uint64_t> items = {kWindow + 100, 6 * kWindow, 12 * kWindow + 7};
  for (std::uint64_t at : items) source.will_need(at, 1200);
  for (std::uint64_t at : items) {
    EXPECT_EQ(read(source, at + 448, 752), object.bytes.substr(at + 448, 752));
    EXPECT_EQ(read(source, at, 448), object.bytes.substr(at, 448));
  }
  ASSERT_EQ(object.fetches.size(), items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(object.fetches[i], std::make_pair(items[i], std::size_t{1200}));
  }
}

TEST(WindowedSourceTest, CloseAnnouncedRangesShareAFetch) {
  FakeObject object(16 * kWindow);
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch());
  // Gaps below window / 8 are read through; a larger one is not.
  source.will_need(1000, 100);
  source.will_need(1000 + 100 + kWindow / 16, 100);
  source.will_need(1000 + 200 + kWindow / 16 + kWindow / 4, 100);
  EXPECT_EQ(read(source, 1000, 100), object.bytes.substr(1000, 100));
  EXPECT_EQ(read(source, 1100 + kWindow / 16, 100), object.bytes.substr(1100 + kWindow / 16, 100));
  ASSERT_EQ(object.fetches.size(), 1u);
  EXPECT_EQ(object.fetches[0], std::make_pair(std::uint64_t{1000}, std::size_t{200 + kWindow / 16}));
}

TEST(WindowedSourceTest, AReaderAheadFetchesTheAnnouncedBytesBehindIt) {
  FakeObject object(4 * kWindow);
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch());
  source.will_need(0, object.bytes.size());
  // Two reader threads in file order: the one ahead misses past the first block's end
  // while the one behind still reads up to it; the block starts at that end, so the one
  // behind finds its bytes there instead of fetching the gap alone.
  EXPECT_EQ(read(source, 0, 4096), object.bytes.substr(0, 4096));
  EXPECT_EQ(read(source, kWindow + 5000, 4096), object.bytes.substr(kWindow + 5000, 4096));
  EXPECT_EQ(read(source, kWindow - 100, 5100), object.bytes.substr(kWindow - 100, 5100));
  ASSERT_EQ(object.fetches.size(), 2u);
  EXPECT_EQ(object.fetches[1], std::make_pair(std::uint64_t{kWindow}, kWindow));
  // Not over bytes read already: a read of a window or more goes straight to the caller,
  // and a later miss looks back only to where that read ended.
  EXPECT_EQ(read(source, 2 * kWindow, kWindow), object.bytes.substr(2 * kWindow, kWindow));
  EXPECT_EQ(read(source, 3 * kWindow + 100, 10), object.bytes.substr(3 * kWindow + 100, 10));
  ASSERT_EQ(object.fetches.size(), 4u);
  EXPECT_EQ(object.fetches[2], std::make_pair(std::uint64_t{2 * kWindow}, kWindow));
  EXPECT_EQ(object.fetches[3], std::make_pair(std::uint64_t{3 * kWindow}, kWindow));
  EXPECT_EQ(object.fetched_bytes(), object.bytes.size());  // no byte twice

  // Not further back than window / 4.
  FakeObject far(4 * kWindow);
  WindowedSource far_source("far", far.bytes.size(), kWindow, 4, far.fetch());
  far_source.will_need(0, far.bytes.size());
  EXPECT_EQ(read(far_source, 2 * kWindow, 100), far.bytes.substr(2 * kWindow, 100));
  ASSERT_EQ(far.fetches.size(), 1u);
  EXPECT_EQ(far.fetches[0], std::make_pair(std::uint64_t{2 * kWindow - kWindow / 4}, kWindow));
}

TEST(WindowedSourceTest, UnannouncedSmallReadsStillFetchAWindow) {
  FakeObject object(16 * kWindow);
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch());
  EXPECT_EQ(read(source, 5 * kWindow, 100), object.bytes.substr(5 * kWindow, 100));
  EXPECT_EQ(read(source, 5 * kWindow - 1000, 100), object.bytes.substr(5 * kWindow - 1000, 100));  // lookbehind
  ASSERT_EQ(object.fetches.size(), 1u);
  EXPECT_EQ(object.fetches[0].second, kWindow);
}

TEST(WindowedSourceTest, FailedFetchIsNotCached) {
  FakeObject object(4 * kWindow);
  int failures = 1;
  RangeFetch ok = object.fetch();
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, [&](std::uint64_t offset, std::span<std::byte> out) {
    if (failures-- > 0) throw std::runtime_error("transient");
    ok(offset, out);
  });
  EXPECT_THROW(read(source, 10, 10), std::runtime_error);
  EXPECT_EQ(read(source, 10, 10), object.bytes.substr(10, 10));
}

}  // namespace
}  // namespace shardpoint::storage::http
