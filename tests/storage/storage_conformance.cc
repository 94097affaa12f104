// The driver-independent Storage contract; see storage_conformance.h.
#include "storage_conformance.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "shardpoint/error.h"
#include "storage_test_util.h"

namespace shardpoint::storage::testing {
namespace {

void put(Storage& s, std::string_view key, const std::string& bytes) {
  auto w = s.open_writer(key);
  w->append(as_bytes(bytes));
  w->commit();
}

std::vector<std::string> keys_of(const std::vector<ObjectInfo>& infos) {
  std::vector<std::string> out;
  for (const auto& i : infos) out.push_back(i.key);
  return out;
}

TEST_P(StorageConformanceTest, WriteCommitReadBack) {
  // Pieces of assorted sizes, crossing block and buffer boundaries.
  std::string data = pattern(3 * 4096 + 17, 1) + pattern(9 << 20, 2) + pattern(5, 3);
  auto w = storage().open_writer("dir/sub/__0_0.distcp");
  EXPECT_EQ(w->key(), "dir/sub/__0_0.distcp");
  std::size_t pos = 0;
  for (std::size_t piece : {std::size_t{1}, std::size_t{4095}, std::size_t{4097}, std::size_t{8 << 20}}) {
    w->append(as_bytes(std::string_view(data).substr(pos, piece)));
    pos += piece;
    EXPECT_EQ(w->position(), pos);
  }
  w->write(std::string_view(data).substr(pos));  // ByteSink interface
  EXPECT_EQ(w->position(), data.size());
  w->commit();
  EXPECT_EQ(storage().stat("dir/sub/__0_0.distcp"), data.size());
  EXPECT_EQ(read_all(storage(), "dir/sub/__0_0.distcp"), data);

  auto source = storage().open_source("dir/sub/__0_0.distcp");
  ASSERT_EQ(source->size(), data.size());
  EXPECT_EQ(source->read_string(4095, 4099, "test"), data.substr(4095, 4099));
  SourceOptions no_mmap;
  no_mmap.prefer_mmap = false;
  auto plain = storage().open_source("dir/sub/__0_0.distcp", no_mmap);
  EXPECT_EQ(plain->read_string(data.size() - 10, 10, "test"), data.substr(data.size() - 10));
}

TEST_P(StorageConformanceTest, EmptyObject) {
  auto w = storage().open_writer("empty");
  w->commit();
  EXPECT_EQ(storage().stat("empty"), 0u);
  std::string none;
  storage().read("empty", 0, std::as_writable_bytes(std::span(none)));
  EXPECT_EQ(storage().open_source("empty")->size(), 0u);
  EXPECT_THROW(read_range(storage(), "empty", 0, 1), FormatError);
}

TEST_P(StorageConformanceTest, RangedReadsAtOddOffsets) {
  std::string data = pattern(100003, 7);
  put(storage(), "obj", data);
  struct Range {
    std::uint64_t offset;
    std::size_t length;
  };
  for (Range r : {Range{0, 1}, Range{1, 7}, Range{4095, 2}, Range{4097, 4096}, Range{12345, 54321}, Range{99999, 4},
                  Range{100003, 0}, Range{0, 100003}}) {
    EXPECT_EQ(read_range(storage(), "obj", r.offset, r.length), data.substr(r.offset, r.length))
        << "offset " << r.offset << " length " << r.length;
  }
}

TEST_P(StorageConformanceTest, ReadPastEndIsFormatErrorNamingTheObject) {
  put(storage(), "short.bin", pattern(10, 1));
  try {
    read_range(storage(), "short.bin", 8, 4);
    FAIL() << "read past end did not throw";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("short.bin"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_range(storage(), "short.bin", 11, 1), FormatError);
  EXPECT_THROW(storage().open_source("short.bin")->read_string(5, 6, "x"), FormatError);
}

TEST_P(StorageConformanceTest, MissingKeyIsNotFound) {
  put(storage(), "present/x", "x");
  for (std::string key : {"absent", "present/absent", "absent/deeper/key", "present"}) {
    if (key == "present" && !GetParam().prefix_keys_answer_not_found) continue;
    try {
      storage().stat(key);
      FAIL() << key;
    } catch (const StorageError& e) {
      EXPECT_EQ(e.kind(), StorageError::Kind::kNotFound) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
    EXPECT_FALSE(storage().try_stat(key).has_value());
    try {
      read_range(storage(), key, 0, 1);
      FAIL() << key;
    } catch (const StorageError& e) {
      EXPECT_EQ(e.kind(), StorageError::Kind::kNotFound) << e.what();
    }
    try {
      storage().open_source(key);
      FAIL() << key;
    } catch (const StorageError& e) {
      EXPECT_EQ(e.kind(), StorageError::Kind::kNotFound) << e.what();
    }
  }
  EXPECT_EQ(storage().try_stat("present/x"), std::optional<std::uint64_t>(1));
  EXPECT_EQ(storage().try_read_all("present/x"), std::optional<std::string>("x"));
  EXPECT_EQ(storage().try_read_all("missing/x"), std::nullopt);
}

TEST_P(StorageConformanceTest, StatListRemove) {
  put(storage(), "a/1", "one");
  put(storage(), "a/2", "twotwo");
  put(storage(), "ab", "x");
  put(storage(), "b/c/1", "");
  storage().write_atomic(".metadata", as_bytes("meta"));
  EXPECT_EQ(storage().stat("a/2"), 6u);

  std::vector<ObjectInfo> all = storage().list("");
  std::vector<ObjectInfo> expected = {{".metadata", 4}, {"a/1", 3}, {"a/2", 6}, {"ab", 1}, {"b/c/1", 0}};
  EXPECT_EQ(all, expected);
  EXPECT_EQ(keys_of(storage().list("a/")), (std::vector<std::string>{"a/1", "a/2"}));
  EXPECT_EQ(keys_of(storage().list("a")), (std::vector<std::string>{"a/1", "a/2", "ab"}));
  EXPECT_EQ(keys_of(storage().list("a/1")), (std::vector<std::string>{"a/1"}));
  EXPECT_EQ(keys_of(storage().list("b/")), (std::vector<std::string>{"b/c/1"}));
  EXPECT_EQ(keys_of(storage().list(".")), (std::vector<std::string>{".metadata"}));
  EXPECT_TRUE(storage().list("zzz/").empty());

  storage().remove("a/1");
  EXPECT_FALSE(storage().try_stat("a/1"));
  EXPECT_NO_THROW(storage().remove("a/1"));  // missing is fine
  EXPECT_NO_THROW(storage().remove("never/was"));
  EXPECT_EQ(keys_of(storage().list("a/")), (std::vector<std::string>{"a/2"}));

  EXPECT_EQ(storage().remove_prefix("a/"), 1u);
  EXPECT_EQ(storage().remove_prefix("a/"), 0u);  // idempotent
  EXPECT_EQ(keys_of(storage().list("")), (std::vector<std::string>{".metadata", "ab", "b/c/1"}));
  EXPECT_EQ(storage().remove_all(), 3u);
  EXPECT_TRUE(storage().list("").empty());
  put(storage(), "a/again", "z");  // the storage still works after remove_all
  EXPECT_EQ(read_all(storage(), "a/again"), "z");
}

TEST_P(StorageConformanceTest, UncommittedWriterLeavesNothing) {
  {
    auto w = storage().open_writer("dir/partial.distcp");
    w->append(as_bytes(pattern(10000, 3)));
  }
  EXPECT_FALSE(storage().try_stat("dir/partial.distcp"));
  EXPECT_TRUE(storage().list("").empty());

  // A failed rewrite leaves the previous object intact, and nothing is visible before commit.
  put(storage(), "k", "version 1");
  {
    auto w = storage().open_writer("k");
    w->append(as_bytes(std::string_view("version 2, longer")));
    EXPECT_EQ(read_all(storage(), "k"), "version 1");
    EXPECT_EQ(storage().list("").size(), 1u);
  }
  EXPECT_EQ(read_all(storage(), "k"), "version 1");
  EXPECT_EQ(keys_of(storage().list("")), (std::vector<std::string>{"k"}));
}

TEST_P(StorageConformanceTest, CommitReplacesAndWriterIsSingleUse) {
  put(storage(), "k", pattern(5000, 1));
  auto w = storage().open_writer("k");
  w->append(as_bytes(std::string_view("short")));
  w->commit();
  EXPECT_EQ(read_all(storage(), "k"), "short");
  EXPECT_THROW(w->append(as_bytes(std::string_view("more"))), UsageError);
  EXPECT_THROW(w->commit(), UsageError);
}

TEST_P(StorageConformanceTest, WriteAtomicReplacesAtomically) {
  const std::string a(64 << 10, 'a');
  const std::string b(64 << 10, 'b');
  storage().write_atomic("ckpt/.metadata", as_bytes(a));
  EXPECT_EQ(read_all(storage(), "ckpt/.metadata"), a);
  storage().write_atomic("ckpt/.metadata", as_bytes(b));
  EXPECT_EQ(read_all(storage(), "ckpt/.metadata"), b);
  EXPECT_EQ(keys_of(storage().list("")), (std::vector<std::string>{"ckpt/.metadata"}));

  // A reader racing the publisher sees one whole version or the other, never a mixture.
  std::atomic<bool> done{false};
  std::atomic<int> mixed{0};
  std::atomic<int> reads{0};
  {
    std::jthread reader([&] {
      while (!done.load()) {
        std::string got = read_all(storage(), "ckpt/.metadata");
        if (got != a && got != b) mixed.fetch_add(1);
        reads.fetch_add(1);
      }
    });
    WriteOptions fast;
    fast.durable = false;
    // Keep publishing until the reader has raced us a few times.
    for (int i = 0; i < 50 || (reads.load() < 20 && i < 200000); ++i) {
      storage().write_atomic("ckpt/.metadata", as_bytes(i % 2 ? a : b), fast);
    }
    done.store(true);
  }
  EXPECT_EQ(mixed.load(), 0);
  EXPECT_GT(reads.load(), 0);
}

// WriteOptions::if_absent (features().conditional_put): a create-only publish succeeds only
// where nothing is, leaves what is there otherwise, and of racing writers exactly one wins.
TEST_P(StorageConformanceTest, CreateOnlyPublishesOnlyWhereNothingIs) {
  if (!storage().features().conditional_put) GTEST_SKIP() << "no conditional_put";
  WriteOptions create_only;
  create_only.if_absent = true;
  const std::string first = pattern(3000, 1);
  storage().write_atomic("c/.metadata", as_bytes(first), create_only);
  EXPECT_EQ(read_all(storage(), "c/.metadata"), first);

  const std::string second = pattern(3000, 2);
  try {
    storage().write_atomic("c/.metadata", as_bytes(second), create_only);
    ADD_FAILURE() << "a second create-only write_atomic succeeded";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kAlreadyExists) << e.what();
    EXPECT_NE(std::string(e.what()).find(storage().describe_key("c/.metadata")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  auto w = storage().open_writer("c/.metadata", create_only);
  w->append(as_bytes(second));
  EXPECT_THROW(
      {
        try {
          w->commit();
        } catch (const StorageError& e) {
          EXPECT_EQ(e.kind(), StorageError::Kind::kAlreadyExists) << e.what();
          throw;
        }
      },
      StorageError);
  w.reset();
  EXPECT_EQ(read_all(storage(), "c/.metadata"), first);
  EXPECT_EQ(keys_of(storage().list("c/")), (std::vector<std::string>{"c/.metadata"}));

  // Without if_absent the same write replaces; after a remove, create-only succeeds again.
  storage().write_atomic("c/.metadata", as_bytes(second));
  EXPECT_EQ(read_all(storage(), "c/.metadata"), second);
  storage().remove("c/.metadata");
  put(storage(), "c/other", "x");
  auto fresh = storage().open_writer("c/.metadata", create_only);
  fresh->append(as_bytes(first));
  fresh->commit();
  EXPECT_EQ(read_all(storage(), "c/.metadata"), first);

  // Four writers race for one key, each with its own bytes: exactly one commits. Only where
  // the atomicity is the driver's own: an object store's is the service's, and the test
  // servers check and store in two steps (moto 5.2.1 without a lock).
  const std::string url = storage().url();
  if (!url.starts_with("file://") && !url.starts_with("memory://")) return;
  std::atomic<int> won{0};
  std::atomic<int> refused{0};
  std::vector<std::string> bodies;
  bodies.reserve(4);
  for (int t = 0; t < 4; ++t) bodies.push_back(pattern(2000, 10 + t));
  {
    std::vector<std::jthread> threads;
    threads.reserve(4);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        try {
          storage().write_atomic("race/.metadata", as_bytes(bodies[static_cast<std::size_t>(t)]), create_only);
          won.fetch_add(1);
        } catch (const StorageError& e) {
          if (e.kind() == StorageError::Kind::kAlreadyExists) refused.fetch_add(1);
        }
      });
    }
  }
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(refused.load(), 3);
  const std::string winner = read_all(storage(), "race/.metadata");
  EXPECT_NE(std::find(bodies.begin(), bodies.end(), winner), bodies.end());
}

TEST_P(StorageConformanceTest, InvalidKeysAreUsageErrors) {
  for (std::string key : std::vector<std::string>{"", "..", "a/../b", "../a", "/abs", "/", "a/./b", "./a", "a/.",
                                                  "a//b", "a/", "x.sp-tmp.1", std::string("nul\0byte", 8)}) {
    SCOPED_TRACE("key \"" + key + "\"");
    std::string buf(1, '\0');
    EXPECT_THROW(storage().stat(key), UsageError);
    EXPECT_THROW(storage().read(key, 0, std::as_writable_bytes(std::span(buf))), UsageError);
    EXPECT_THROW(storage().open_source(key), UsageError);
    EXPECT_THROW(storage().open_writer(key), UsageError);
    EXPECT_THROW(storage().write_atomic(key, as_bytes(buf)), UsageError);
    EXPECT_THROW(storage().remove(key), UsageError);
  }
  try {
    storage().stat("a/../b");
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("\"a/../b\""), std::string::npos) << e.what();
  }
  for (std::string prefix : {"../", "/abs", "a/../", "a//"}) {
    EXPECT_THROW(storage().list(prefix), UsageError) << prefix;
    EXPECT_THROW(storage().remove_prefix(prefix), UsageError) << prefix;
  }
  EXPECT_TRUE(storage().list("").empty());  // nothing escaped the root
}

std::string key_for(int rank, int n) {
  return "rank" + std::to_string(rank) + "/__" + std::to_string(rank) + "_" + std::to_string(n) + ".distcp";
}

TEST_P(StorageConformanceTest, FourThreadsWriteDifferentKeys) {
  constexpr int kThreads = 4;
  constexpr int kKeys = 12;
  std::vector<std::exception_ptr> errors(kThreads);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          for (int k = 0; k < kKeys; ++k) {
            std::string key = key_for(t, k);
            std::string data = pattern(1000 * (k + 1) + t, t * 100 + k);
            if (k % 3 == 0) {
              storage().write_atomic(key, as_bytes(data));
            } else {
              auto w = storage().open_writer(key);
              w->append(as_bytes(data).first(data.size() / 2));
              w->append(as_bytes(data).subspan(data.size() / 2));
              w->commit();
            }
          }
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    }
  }
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  EXPECT_EQ(storage().list("").size(), static_cast<std::size_t>(kThreads * kKeys));
  for (int t = 0; t < kThreads; ++t) {
    for (int k = 0; k < kKeys; ++k) {
      std::string key = key_for(t, k);
      EXPECT_EQ(read_all(storage(), key), pattern(1000 * (k + 1) + t, t * 100 + k)) << key;
    }
  }
}

TEST_P(StorageConformanceTest, ConcurrentRangedReadsOfOneObject) {
  const std::string data = pattern(1 << 20, 11);
  put(storage(), "shared.distcp", data);
  auto source = storage().open_source("shared.distcp");
  std::atomic<int> wrong{0};
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (std::uint64_t off = t * 101; off + 777 <= data.size(); off += 50021) {
          if (read_range(storage(), "shared.distcp", off, 777) != data.substr(off, 777)) wrong.fetch_add(1);
          if (source->read_string(off, 777, "x") != data.substr(off, 777)) wrong.fetch_add(1);
        }
      });
    }
  }
  EXPECT_EQ(wrong.load(), 0);
}

TEST_P(StorageConformanceTest, ParallelWriteAtDisjointRanges) {
  if (!storage().features().parallel_writes) GTEST_SKIP() << "driver has no parallel writes";
  // Items at unaligned offsets, as the engine lays them out, with a gap that reads as zero.
  std::vector<std::pair<std::uint64_t, std::string>> items;
  std::uint64_t offset = 3;  // bytes [0,3) are never written
  for (int i = 0; i < 16; ++i) {
    std::string data = pattern(static_cast<std::size_t>(1 + i * 37717 + (i % 3) * 4096), i);
    items.emplace_back(offset, data);
    offset += data.size();
  }
  auto w = storage().open_writer("parallel.distcp");
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (std::size_t i = t; i < items.size(); i += 4) w->write_at(items[i].first, as_bytes(items[i].second));
      });
    }
  }
  EXPECT_THROW(w->append(as_bytes(std::string_view("x"))), UsageError);  // modes don't mix
  w->commit();
  ASSERT_EQ(storage().stat("parallel.distcp"), offset);
  EXPECT_EQ(read_range(storage(), "parallel.distcp", 0, 3), std::string(3, '\0'));
  for (const auto& [off, data] : items) EXPECT_EQ(read_range(storage(), "parallel.distcp", off, data.size()), data);
}

TEST_P(StorageConformanceTest, SourceKeepsItsBytesAfterReplaceAndRemove) {
  std::string v1 = pattern(20000, 1);
  storage().write_atomic("k", as_bytes(v1));
  auto mapped = storage().open_source("k");
  SourceOptions no_mmap;
  no_mmap.prefer_mmap = false;
  auto plain = storage().open_source("k", no_mmap);
  storage().write_atomic("k", as_bytes(pattern(20000, 2)));
  EXPECT_EQ(mapped->read_string(0, v1.size(), "x"), v1);
  storage().remove("k");
  EXPECT_EQ(plain->read_string(0, v1.size(), "x"), v1);
}

TEST_P(StorageConformanceTest, CancelledAndExpiredCallsFail) {
  put(storage(), "k", "data");
  std::stop_source stop;
  stop.request_stop();
  IoOptions cancelled;
  cancelled.stop = stop.get_token();
  try {
    storage().stat("k", cancelled);
    FAIL();
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kOther);
    EXPECT_NE(std::string(e.what()).find("cancelled"), std::string::npos) << e.what();
  }
  IoOptions expired = IoOptions::with_timeout(std::chrono::seconds(-1));
  try {
    storage().write_atomic("k", as_bytes(std::string_view("new")), {}, expired);
    FAIL();
  } catch (const StorageError& e) {
    EXPECT_TRUE(e.retryable()) << e.what();
  }
  auto w = storage().open_writer("w");
  EXPECT_THROW(w->append(as_bytes(std::string_view("x")), cancelled), StorageError);
  EXPECT_EQ(read_all(storage(), "k"), "data");
  EXPECT_NO_THROW(storage().stat("k", IoOptions::with_timeout(std::chrono::minutes(1))));
}

TEST_P(StorageConformanceTest, DescribeKeyNamesTheKey) {
  EXPECT_NE(storage().describe_key("dir/__0_0.distcp").find("dir/__0_0.distcp"), std::string::npos);
  EXPECT_FALSE(storage().url().empty());
}

}  // namespace
}  // namespace shardpoint::storage::testing
