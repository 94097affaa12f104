// WindowedStorage: reads through the shared windows return the object's bytes (small reads,
// reads across a window boundary, large reads past the windows), locally and in memory.
#include "storage/windowed_storage.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/byte_stream.h"
#include "shardpoint/error.h"
#include "storage/local_storage.h"
#include "storage/memory_storage.h"
#include "test_util.h"

namespace shardpoint::storage {
namespace {

std::string pattern(std::size_t n, char salt) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + static_cast<std::size_t>(salt)) & 0xff);
  return s;
}

void expect_reads_match(const std::shared_ptr<Storage>& target) {
  const std::string a = pattern(3 * kWindowBytes + 123, 'a');
  const std::string b = pattern(1000, 'b');
  target->write_atomic("a.bin", as_bytes(a));
  target->write_atomic("dir/b.bin", as_bytes(b));
  std::shared_ptr<Storage> windowed = make_windowed_storage(target);
  std::unique_ptr<ByteSource> sa = windowed->open_source("a.bin");
  std::unique_ptr<ByteSource> sb = windowed->open_source("dir/b.bin");
  ASSERT_EQ(sa->size(), a.size());
  struct Read {
    std::uint64_t offset;
    std::size_t n;
  };
  // Small reads inside windows, one across a window boundary, one of half a window (goes
  // straight to the storage), the last bytes, and an empty read.
  for (const Read r : {Read{0, 8}, Read{100, 4000}, Read{kWindowBytes - 4, 8}, Read{kWindowBytes, kWindowBytes / 2},
                       Read{a.size() - 7, 7}, Read{5, 0}, Read{2 * kWindowBytes + 17, 64}}) {
    std::vector<std::byte> out(r.n);
    sa->read(r.offset, out, "test read");
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(out.data()), out.size()), a.substr(r.offset, r.n))
        << r.offset << "+" << r.n;
    // Interleaved reads of another object must not see a's windows.
    std::vector<std::byte> other(16);
    sb->read(r.offset % 900, other, "test read");
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(other.data()), 16), b.substr(r.offset % 900, 16));
  }
  std::vector<std::byte> past(8);
  EXPECT_THROW(sa->read(a.size() - 4, past, "test read"), Error);
  // Everything else is forwarded.
  EXPECT_EQ(windowed->stat("dir/b.bin"), b.size());
}

TEST(WindowedStorageTest, LocalFiles) {
  testing::TempDir dir;
  expect_reads_match(open_local_storage_at(dir.path().string(), {}));
}

TEST(WindowedStorageTest, MemoryObjects) {
  expect_reads_match(open_memory_storage(Location::parse("memory://windowed-storage-test"), {}));
}

}  // namespace
}  // namespace shardpoint::storage
