// http::WindowedSource (the object-store drivers' lazy source): the bytes of any read are
// the object's, blocks tile the object instead of overlapping, and announced ranges
// (will_need) size the ranged fetches: a lone small item is one small fetch, a run of items
// one window, and a reader ahead fetches the announced bytes a reader behind it needs next.
// Fetching ahead: the next announced blocks are fetched without a reader asking, within the
// cache's budget and keeping blocks not read through; a failed fetch ahead reaches only the
// reader of its bytes, which fetches them again; destroying the source while a fetch ahead
// is in flight waits for it. The first bytes the open fetched are adopted as a block when
// they fit. A ReadAheadBudget shared by several sources: their blocks stay
// within it together (read-through blocks of other sources dropped first), a source
// holding all of it in fetches does not block another's reads, and parallel readers of
// several sources stay within it plus a block per reader.
#include "storage/http/ranged_reads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
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

// An object whose fetches can be held at a gate (those at offsets in `held`, until
// open_gate()) or fail (once for each entry of `failing`), and which counts them; tests wait
// for the fetches the source makes on its own threads instead of sleeping.
struct GatedObject {
  // Only a guard against a hang: every wait ends as soon as what it waits for happens.
  static constexpr std::chrono::seconds kGuard{60};

  std::string bytes;
  std::mutex mu;
  std::condition_variable changed;
  std::set<std::uint64_t> held;
  std::multiset<std::uint64_t> failing;
  bool gate_open = false;
  std::vector<std::uint64_t> started;                          // offsets, as fetches start
  std::vector<std::pair<std::uint64_t, std::size_t>> fetches;  // completed: (offset, length)

  explicit GatedObject(std::size_t n) : bytes(FakeObject(n).bytes) {}

  RangeFetch fetch() {
    return [this](std::uint64_t offset, std::span<std::byte> out) {
      std::unique_lock lock(mu);
      started.push_back(offset);
      changed.notify_all();
      if (held.count(offset) != 0 && !changed.wait_for(lock, kGuard, [&] { return gate_open; })) {
        throw std::runtime_error("test gate never opened");
      }
      if (auto f = failing.find(offset); f != failing.end()) {
        failing.erase(f);
        throw std::runtime_error("injected failure at " + std::to_string(offset));
      }
      std::memcpy(out.data(), bytes.data() + offset, out.size());
      fetches.emplace_back(offset, out.size());
      changed.notify_all();
    };
  }
  void open_gate() {
    std::lock_guard lock(mu);
    gate_open = true;
    changed.notify_all();
  }
  // Waits until pred() (called with mu held); false after kGuard.
  template <typename Pred>
  bool wait(Pred pred) {
    std::unique_lock lock(mu);
    return changed.wait_for(lock, kGuard, pred);
  }
  std::size_t count(const std::vector<std::uint64_t>& offsets, std::uint64_t offset) {
    return static_cast<std::size_t>(std::count(offsets.begin(), offsets.end(), offset));
  }
  std::size_t fetched_at(std::uint64_t offset) {
    return static_cast<std::size_t>(
        std::count_if(fetches.begin(), fetches.end(), [&](const auto& f) { return f.first == offset; }));
  }
  // After reading the whole object through a source of window-sized blocks: `expected`
  // fetches in all, and the block at every window boundary fetched exactly once.
  void expect_each_window_fetched_once(std::size_t expected) {
    std::lock_guard lock(mu);
    EXPECT_EQ(fetches.size(), expected);
    for (std::uint64_t at = 0; at < bytes.size(); at += kWindow) EXPECT_EQ(fetched_at(at), 1u) << at;
  }
};

TEST(WindowedSourceTest, FetchesTheNextAnnouncedBlocksAhead) {
  GatedObject object(8 * kWindow);
  object.held = {kWindow, 2 * kWindow};
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch(), /*ahead=*/2);
  source.will_need(0, object.bytes.size());
  // A miss fetches its block, and the next announced blocks without a reader asking, two
  // at once (a third would be cached as soon as it is queued).
  EXPECT_EQ(read(source, 0, 100), object.bytes.substr(0, 100));
  ASSERT_TRUE(object.wait([&] { return object.started.size() == 3; }));
  EXPECT_EQ(source.cached_bytes(), 3 * kWindow);
  // Then as fetches end, until the cache is full of blocks not read through.
  object.open_gate();
  ASSERT_TRUE(object.wait([&] { return object.fetches.size() == 4; }));
  EXPECT_EQ(source.cached_bytes(), 4 * kWindow);
  {
    std::lock_guard lock(object.mu);
    for (std::uint64_t at = 0; at < 4 * kWindow; at += kWindow) EXPECT_EQ(object.fetched_at(at), 1u) << at;
    for (const auto& f : object.fetches) EXPECT_EQ(f.second, kWindow) << f.first;
  }
  // Reading the first block through makes room for the next.
  EXPECT_EQ(read(source, 100, kWindow - 100), object.bytes.substr(100, kWindow - 100));
  ASSERT_TRUE(object.wait([&] { return object.fetches.size() == 5; }));
  {
    std::lock_guard lock(object.mu);
    EXPECT_EQ(object.fetches.back(), std::make_pair(std::uint64_t{4 * kWindow}, kWindow));
  }
  // Read to the end (3000 does not divide the window): every byte right, none fetched twice.
  for (std::uint64_t at = kWindow; at < object.bytes.size(); at += 3000) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(3000, object.bytes.size() - at));
    ASSERT_EQ(read(source, at, n), object.bytes.substr(at, n));
  }
  object.expect_each_window_fetched_once(8u);
}

TEST(WindowedSourceTest, NothingIsFetchedAheadOfUnannouncedReads) {
  GatedObject object(8 * kWindow);
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch(), /*ahead=*/3);
  EXPECT_EQ(read(source, 0, 100), object.bytes.substr(0, 100));
  EXPECT_EQ(read(source, 5 * kWindow, 100), object.bytes.substr(5 * kWindow, 100));
  EXPECT_EQ(source.cached_bytes(), 2 * kWindow);  // a fetch ahead would be cached when queued
  std::lock_guard lock(object.mu);
  EXPECT_EQ(object.started.size(), 2u);
}

TEST(WindowedSourceTest, AFailedFetchAheadReachesOnlyTheReaderOfItsBytes) {
  GatedObject object(8 * kWindow);
  object.held = {kWindow};
  object.failing = {kWindow};
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch(), /*ahead=*/2);
  source.will_need(0, object.bytes.size());
  EXPECT_EQ(read(source, 0, 100), object.bytes.substr(0, 100));  // fetches [w, 2w) ahead, held
  // A reader of the held block waits for it (or, if the fetch failed first, misses); the
  // fetch fails, and the reader fetches the bytes itself without an error either way.
  std::string behind;
  std::jthread reader([&] { behind = read(source, kWindow + 10, 10); });
  object.open_gate();
  reader.join();
  EXPECT_EQ(behind, object.bytes.substr(kWindow + 10, 10));
  // Readers of other bytes never see the error.
  EXPECT_EQ(read(source, 50, 100), object.bytes.substr(50, 100));
  EXPECT_EQ(read(source, 2 * kWindow + 7, 100), object.bytes.substr(2 * kWindow + 7, 100));
  std::lock_guard lock(object.mu);
  EXPECT_EQ(object.count(object.started, kWindow), 2u);  // the failed fetch ahead, then the reader's
  EXPECT_EQ(object.fetched_at(kWindow), 1u);
}

TEST(WindowedSourceTest, AFailedFetchAheadIsNotCachedNorRetriedInTheBackground) {
  GatedObject object(8 * kWindow);
  object.failing = {kWindow, kWindow, kWindow};  // ahead, the reader's own fetch, its next read
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch(), /*ahead=*/1);
  source.will_need(0, object.bytes.size());
  EXPECT_EQ(read(source, 0, 100), object.bytes.substr(0, 100));
  ASSERT_TRUE(object.wait([&] { return object.count(object.started, kWindow) == 1; }));
  // The reader's own fetch fails too: its error is the reader's. The next read tries again.
  EXPECT_THROW(read(source, kWindow + 10, 10), std::runtime_error);
  EXPECT_THROW(read(source, kWindow + 10, 10), std::runtime_error);
  {
    std::lock_guard lock(object.mu);
    EXPECT_EQ(object.count(object.started, kWindow), 3u);
    EXPECT_EQ(object.started.size(), 4u);  // nothing fetched ahead since the failure
  }
  // A fetch that succeeds resumes fetching ahead; the block is the announced range.
  EXPECT_EQ(read(source, kWindow + 10, 10), object.bytes.substr(kWindow + 10, 10));
  ASSERT_TRUE(object.wait([&] { return object.fetched_at(2 * kWindow) == 1; }));
  std::lock_guard lock(object.mu);
  EXPECT_EQ(object.count(object.started, kWindow), 4u);
  EXPECT_EQ(object.fetched_at(kWindow), 1u);
  for (const auto& f : object.fetches) EXPECT_EQ(f.second, kWindow) << f.first;
}

TEST(WindowedSourceTest, FetchesAheadStayWithinTheCache) {
  constexpr int kWindows = 4;
  constexpr std::uint64_t kBudget = kWindows * kWindow;
  GatedObject object(32 * kWindow);
  object.held = {kWindow, 2 * kWindow, 3 * kWindow};
  // More fetches ahead than the cache holds blocks: windows - 1 at once.
  WindowedSource source("obj", object.bytes.size(), kWindow, kWindows, object.fetch(), /*ahead=*/8);
  source.will_need(0, object.bytes.size());
  EXPECT_EQ(read(source, 0, 100), object.bytes.substr(0, 100));
  ASSERT_TRUE(object.wait([&] { return object.started.size() == 4; }));
  EXPECT_EQ(source.cached_bytes(), kBudget);
  // The cache is all fetches ahead in flight and a block read in part: a miss elsewhere
  // drops that block for its own, and nothing more is fetched ahead.
  EXPECT_EQ(read(source, 20 * kWindow, 100), object.bytes.substr(20 * kWindow, 100));
  EXPECT_EQ(source.cached_bytes(), kBudget);
  EXPECT_EQ(read(source, 24 * kWindow, 100), object.bytes.substr(24 * kWindow, 100));
  EXPECT_EQ(source.cached_bytes(), kBudget);
  {
    std::lock_guard lock(object.mu);
    EXPECT_EQ(object.started.size(), 6u);
  }
  object.open_gate();
  // Streaming through the rest keeps the cache within the budget at every read.
  for (std::uint64_t at = kWindow; at + 64 <= object.bytes.size(); at += kWindow / 3) {
    ASSERT_EQ(read(source, at, 64), object.bytes.substr(at, 64));
    ASSERT_LE(source.cached_bytes(), kBudget) << at;
  }
  std::lock_guard lock(object.mu);
  for (std::uint64_t at : object.held) EXPECT_EQ(object.fetched_at(at), 1u) << at;  // kept until read
}

TEST(WindowedSourceTest, BlocksNotReadThroughAreKeptForTheReadersBehind) {
  GatedObject object(16 * kWindow);
  WindowedSource source("obj", object.bytes.size(), kWindow, 4, object.fetch(), /*ahead=*/2);
  source.will_need(0, object.bytes.size());
  // One reader stays in the first block while another reads ahead through the blocks
  // fetched for it: the first block stays cached until it is read through.
  EXPECT_EQ(read(source, 0, 100), object.bytes.substr(0, 100));
  for (std::uint64_t at = kWindow; at < 4 * kWindow; at += kWindow / 2) {
    ASSERT_EQ(read(source, at, kWindow / 2), object.bytes.substr(at, kWindow / 2));
  }
  EXPECT_EQ(read(source, 100, kWindow - 100), object.bytes.substr(100, kWindow - 100));
  for (std::uint64_t at = 4 * kWindow; at < object.bytes.size(); at += kWindow / 2) {
    ASSERT_EQ(read(source, at, kWindow / 2), object.bytes.substr(at, kWindow / 2));
  }
  object.expect_each_window_fetched_once(16u);
}

TEST(WindowedSourceTest, ABlockIsReadThroughWhenEveryAnnouncedByteWasRead) {
  GatedObject object(8 * kWindow);
  WindowedSource source("obj", object.bytes.size(), kWindow, 2, object.fetch(), /*ahead=*/1);
  // A header read before the announcement fetches an unannounced block; the announcement
  // then makes its bytes that block's to be read (not counting the ones read already).
  EXPECT_EQ(read(source, 0, 100), object.bytes.substr(0, 100));
  source.will_need(0, object.bytes.size());
  // Bytes read twice count once: with [w - 100, w) unread the block stays, and nothing more
  // is fetched ahead than the one block that fits beside it.
  for (int twice = 0; twice < 2; ++twice) EXPECT_EQ(read(source, 50, 150), object.bytes.substr(50, 150));
  EXPECT_EQ(read(source, 200, kWindow - 300), object.bytes.substr(200, kWindow - 300));
  EXPECT_EQ(read(source, kWindow, 10), object.bytes.substr(kWindow, 10));  // waits for the fetch ahead
  EXPECT_EQ(source.cached_bytes(), 2 * kWindow);
  {
    std::lock_guard lock(object.mu);
    EXPECT_EQ(object.started.size(), 2u);
  }
  // The last announced bytes: the block is read through and makes room for the next.
  EXPECT_EQ(read(source, kWindow - 100, 100), object.bytes.substr(kWindow - 100, 100));
  ASSERT_TRUE(object.wait([&] { return object.fetched_at(2 * kWindow) == 1; }));
  std::lock_guard lock(object.mu);
  EXPECT_EQ(object.fetched_at(0), 1u);
  EXPECT_EQ(object.fetched_at(kWindow), 1u);
}

TEST(WindowedSourceTest, DestroyingWhileFetchingAheadWaitsForTheFetch) {
  for (bool fail : {false, true}) {
    GatedObject object(8 * kWindow);
    object.held = {kWindow, 2 * kWindow, 3 * kWindow};
    if (fail) object.failing = {2 * kWindow};
    auto source = std::make_unique<WindowedSource>("obj", object.bytes.size(), kWindow, 4, object.fetch(), 3);
    source->will_need(0, object.bytes.size());
    EXPECT_EQ(read(*source, 0, 100), object.bytes.substr(0, 100));
    ASSERT_TRUE(object.wait([&] { return object.started.size() == 4; }));
    // The gate opens once the destructor is on its way; the fetches then write into the
    // source's buffers and update its cache before it is gone (ASan checks the order).
    std::jthread opener([&] {
      object.wait([&] { return source == nullptr; });
      object.open_gate();
    });
    {
      std::unique_ptr<WindowedSource> dying;
      {
        std::lock_guard lock(object.mu);
        dying = std::move(source);
        object.changed.notify_all();
      }
    }
    opener.join();
    std::lock_guard lock(object.mu);
    EXPECT_EQ(object.started.size(), 4u);
    EXPECT_EQ(object.fetches.size(), fail ? 3u : 4u);
  }
}

// Reads [0, size) in pieces of `piece` (announced first).
void stream_through(const WindowedSource& source, const std::string& bytes, std::size_t piece) {
  source.will_need(0, bytes.size());
  for (std::uint64_t at = 0; at < bytes.size(); at += piece) {
    const std::size_t n = std::min<std::size_t>(piece, bytes.size() - at);
    ASSERT_EQ(read(source, at, n), bytes.substr(at, n)) << at;
  }
}

// The first bytes the open brought are a block: read from it without a fetch, announced
// bytes in it kept as unread; with no room in the shared budget (others' blocks unread) they
// are dropped and the reader fetches them.
TEST(WindowedSourceTest, AdoptedFirstBlockIsReadWithoutAFetchWhenItFits) {
  FakeObject object(4 * kWindow);
  const auto first_bytes = [&](std::uint64_t n) {
    std::shared_ptr<std::byte[]> bytes = std::make_shared_for_overwrite<std::byte[]>(n);
    std::memcpy(bytes.get(), object.bytes.data(), n);
    return bytes;
  };
  auto budget = std::make_shared<ReadAheadBudget>(2 * kWindow);
  WindowedSource source("obj", object.bytes.size(), kWindow, 2, object.fetch(), 0, budget);
  source.adopt_first_block(first_bytes(kWindow / 2), kWindow / 2);
  EXPECT_EQ(source.cached_bytes(), kWindow / 2);
  EXPECT_EQ(budget->used(), kWindow / 2);
  source.will_need(0, kWindow);
  EXPECT_EQ(read(source, 100, 1000), object.bytes.substr(100, 1000));
  EXPECT_TRUE(object.fetches.empty());
  // Past the block: a fetch that starts where the block ends (blocks tile the object).
  EXPECT_EQ(read(source, kWindow / 2 - 10, 20), object.bytes.substr(kWindow / 2 - 10, 20));
  ASSERT_EQ(object.fetches.size(), 1u);
  EXPECT_EQ(object.fetches[0].first, kWindow / 2);

  // The budget is held by another source's unread blocks: nothing adopted.
  FakeObject other_object(4 * kWindow);
  WindowedSource other("other", other_object.bytes.size(), kWindow, 2, other_object.fetch(), 0, budget);
  other.will_need(0, other_object.bytes.size());
  read(other, 0, 10);
  read(other, kWindow, 10);
  WindowedSource late("late", object.bytes.size(), kWindow, 2, object.fetch(), 0, budget);
  late.adopt_first_block(first_bytes(kWindow / 2), kWindow / 2);
  EXPECT_EQ(late.cached_bytes(), 0u);
  EXPECT_EQ(read(late, 0, 10), object.bytes.substr(0, 10));
  EXPECT_EQ(object.fetches.size(), 2u);
}

TEST(ReadAheadBudgetTest, SourcesDropEachOthersReadThroughBlocksToStayWithinIt) {
  constexpr std::uint64_t kBudget = 4 * kWindow;
  auto budget = std::make_shared<ReadAheadBudget>(kBudget);
  FakeObject a_object(8 * kWindow);
  FakeObject b_object(8 * kWindow);
  // No fetches ahead: every block is a reader's miss, on this thread.
  WindowedSource a("a", a_object.bytes.size(), kWindow, 4, a_object.fetch(), 0, budget);
  WindowedSource b("b", b_object.bytes.size(), kWindow, 4, b_object.fetch(), 0, budget);
  stream_through(a, a_object.bytes, kWindow / 3);
  EXPECT_EQ(a.cached_bytes(), kBudget);  // its last 4 blocks, read through
  EXPECT_EQ(budget->used(), kBudget);
  // Each block b fetches takes the room of one of a's: together they stay at the budget.
  b.will_need(0, b_object.bytes.size());
  for (std::uint64_t block = 0; block < 6; ++block) {
    ASSERT_EQ(read(b, block * kWindow, kWindow / 2), b_object.bytes.substr(block * kWindow, kWindow / 2));
    EXPECT_EQ(b.cached_bytes(), std::min<std::uint64_t>(block + 1, 4) * kWindow) << block;
    EXPECT_EQ(a.cached_bytes() + b.cached_bytes(), kBudget) << block;
    EXPECT_EQ(budget->used(), kBudget) << block;
  }
  // b's blocks are each half read (the rest announced): a's read-through ones went first,
  // then b dropped its own furthest. a reading again takes room from b's unread ones.
  EXPECT_EQ(a.cached_bytes(), 0u);
  EXPECT_EQ(read(a, 0, 10), a_object.bytes.substr(0, 10));
  EXPECT_EQ(a.cached_bytes(), kWindow);
  EXPECT_EQ(b.cached_bytes(), kBudget - kWindow);
  EXPECT_EQ(budget->peak(), kBudget);
  EXPECT_EQ(a_object.fetches.size(), 9u);  // a's 8 blocks, then block 0 again
}

TEST(ReadAheadBudgetTest, ASourceHoldingAllOfItInFetchesDoesNotBlockAnother) {
  constexpr std::uint64_t kBudget = 4 * kWindow;
  auto budget = std::make_shared<ReadAheadBudget>(kBudget);
  GatedObject a_object(16 * kWindow);
  a_object.held = {kWindow, 2 * kWindow, 3 * kWindow};
  FakeObject b_object(8 * kWindow);
  WindowedSource a("a", a_object.bytes.size(), kWindow, 4, a_object.fetch(), /*ahead=*/3, budget);
  WindowedSource b("b", b_object.bytes.size(), kWindow, 4, b_object.fetch(), /*ahead=*/3, budget);
  a.will_need(0, a_object.bytes.size());
  EXPECT_EQ(read(a, 0, 100), a_object.bytes.substr(0, 100));
  ASSERT_TRUE(a_object.wait([&] { return a_object.started.size() == 4; }));
  EXPECT_EQ(budget->used(), kBudget);  // a's first block and its 3 fetches ahead, held
  // b reads all of its object: its first miss drops a's one block not being fetched, then
  // b's blocks take turns in that room (each fetched once), and b never waits for a.
  stream_through(b, b_object.bytes, kWindow / 2);
  EXPECT_EQ(b_object.fetches.size(), 8u);
  EXPECT_LE(budget->peak(), kBudget + kWindow);  // one block beyond, for b's one reader
  a_object.open_gate();
  for (std::uint64_t at = 100; at < a_object.bytes.size(); at += kWindow / 2) {
    const std::size_t n = std::min<std::size_t>(kWindow / 2, a_object.bytes.size() - at);
    ASSERT_EQ(read(a, at, n), a_object.bytes.substr(at, n)) << at;
  }
  EXPECT_LE(budget->peak(), kBudget + kWindow);
}

TEST(ReadAheadBudgetTest, ParallelReadersOfSeveralSourcesStayWithinItPlusABlockEach) {
  constexpr int kSources = 4;
  constexpr std::uint64_t kBudget = 4 * kWindow;
  auto budget = std::make_shared<ReadAheadBudget>(kBudget);
  std::vector<std::unique_ptr<FakeObject>> objects;
  std::vector<std::unique_ptr<WindowedSource>> sources;
  for (int i = 0; i < kSources; ++i) {
    objects.push_back(std::make_unique<FakeObject>(24 * kWindow + std::size_t{1000} * i));
    sources.push_back(std::make_unique<WindowedSource>("s" + std::to_string(i), objects[i]->bytes.size(), kWindow, 4,
                                                       objects[i]->fetch(), /*ahead=*/3, budget));
  }
  {
    std::vector<std::jthread> readers;
    readers.reserve(kSources);
    for (int i = 0; i < kSources; ++i) {
      readers.emplace_back([&, i] { stream_through(*sources[i], objects[i]->bytes, kWindow / 5); });
    }
  }
  // Fetches ahead never go beyond the budget; a miss may, by its one block.
  EXPECT_LE(budget->peak(), kBudget + kSources * kWindow);
  std::uint64_t cached = 0;
  for (const auto& source : sources) cached += source->cached_bytes();
  EXPECT_EQ(budget->used(), cached);
  sources.clear();
  EXPECT_EQ(budget->used(), 0u);
}

}  // namespace
}  // namespace shardpoint::storage::http
