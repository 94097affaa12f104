// The "file" driver: the conformance suite on a real temporary directory, plus what only a
// local filesystem has (O_DIRECT, fallback, permissions, crash leftovers, mmap limits).
#include "storage/local_storage.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/buffer_pool.h"
#include "shardpoint/error.h"
#include "storage_conformance.h"
#include "storage_test_util.h"
#include "test_util.h"

namespace shardpoint::storage::testing {
namespace {

StorageUnderTest make_local() {
  auto dir = std::make_shared<shardpoint::testing::TempDir>();
  // A root that does not exist yet: the first write creates it.
  return {open_local_storage_at((dir->path() / "root").string()), dir};
}

INSTANTIATE_TEST_SUITE_P(Local, StorageConformanceTest, ::testing::Values(StorageFactory{"local", &make_local}),
                         StorageFactoryName());

}  // namespace
}  // namespace shardpoint::storage::testing

namespace shardpoint::storage {
namespace {

using shardpoint::testing::read_text;
using shardpoint::testing::TempDir;
using shardpoint::testing::write_text;
using storage::testing::pattern;
namespace fs = std::filesystem;

// The open-file flags of this process's descriptor on a path starting with path_prefix
// (found through /proc/self/fd), or -1.
long open_flags_of(const std::string& path_prefix) {
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    fs::path target = fs::read_symlink(entry.path(), ec);
    if (ec || !target.string().starts_with(path_prefix)) continue;
    std::ifstream info("/proc/self/fdinfo/" + entry.path().filename().string());
    std::string field;
    while (info >> field) {
      if (field == "flags:") {
        std::string octal;
        info >> octal;
        return std::strtol(octal.c_str(), nullptr, 8);
      }
    }
  }
  return -1;
}

bool filesystem_refuses_direct_io(const std::string& dir) {
  std::string probe = dir + "/.direct-probe";
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  bool refused = fd < 0 && errno == EINVAL;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return refused;
}

TEST(LocalStorageTest, DirectIoWritesExactSizes) {
  TempDir dir;
  if (filesystem_refuses_direct_io(dir.path().string())) GTEST_SKIP() << "$TMPDIR refuses O_DIRECT";
  auto storage = open_local_storage_at(dir.path().string());
  ASSERT_TRUE(storage->features().direct_io);
  for (std::size_t size : {std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097},
                           (std::size_t{8} << 20) + 3, (std::size_t{16} << 20) + 4096}) {
    SCOPED_TRACE(size);
    std::string data = pattern(size, static_cast<std::uint32_t>(size));
    auto w = storage->open_writer("d/" + std::to_string(size));
    // Odd-sized pieces: the staging buffer fills and drains at unaligned points.
    for (std::size_t pos = 0; pos < size;) {
      std::size_t n = std::min<std::size_t>(size - pos, 1000003);
      w->append(as_bytes(std::string_view(data).substr(pos, n)));
      pos += n;
    }
    long flags = open_flags_of(dir.file("d/" + std::to_string(size)) + std::string(kTempMarker));
    ASSERT_NE(flags, -1);
    EXPECT_TRUE(flags & O_DIRECT) << "writer did not use O_DIRECT";
    w->commit();
    std::string path = dir.file("d/" + std::to_string(size));
    EXPECT_EQ(fs::file_size(path), size);
    EXPECT_TRUE(read_text(path) == data);
  }
}

TEST(LocalStorageTest, ParallelWriteAtUsesDirectIoForAlignedMiddles) {
  TempDir dir;
  if (filesystem_refuses_direct_io(dir.path().string())) GTEST_SKIP() << "$TMPDIR refuses O_DIRECT";
  auto storage = open_local_storage_at(dir.path().string());
  // One page-aligned source written at aligned and unaligned file offsets, so the middle
  // goes direct from caller memory, through a pool buffer, or not at all.
  std::size_t size = (std::size_t{3} << 20) + 100;
  std::string data = pattern(size, 4);
  void* raw = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  std::unique_ptr<void, decltype(&std::free)> aligned(raw, &std::free);
  std::memcpy(raw, data.data(), size);
  ByteSpan src{static_cast<const std::byte*>(raw), size};
  const std::uint64_t offsets[] = {0, size + 1000, 2 * size + 8191, 4 * size};
  auto w = storage->open_writer("items.distcp");
  {
    std::vector<std::jthread> threads;
    for (std::uint64_t off : offsets) threads.emplace_back([&, off] { w->write_at(off, src); });
  }
  w->write_at(5 * size, src.first(10));  // smaller than a block: buffered only
  long flags = open_flags_of(dir.file("items.distcp") + std::string(kTempMarker));
  EXPECT_TRUE(flags & O_DIRECT);
  w->commit();
  std::string got = read_text(dir.file("items.distcp"));
  ASSERT_EQ(got.size(), 5 * size + 10);
  for (std::uint64_t off : offsets) EXPECT_TRUE(got.substr(off, size) == data) << off;
  EXPECT_EQ(got.substr(size, 1000), std::string(1000, '\0'));  // the gap was never written
  EXPECT_EQ(got.substr(5 * size), data.substr(0, 10));
}

TEST(LocalStorageTest, DirectIoFromAlignedCallerMemory) {
  TempDir dir;
  auto storage = open_local_storage_at(dir.path().string());
  // Page-aligned caller memory larger than a pool buffer goes to the file without a copy;
  // the unaligned remainder is staged.
  std::size_t size = (std::size_t{24} << 20) + 5;
  std::string data = pattern(size, 9);
  void* raw = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  std::unique_ptr<void, decltype(&std::free)> aligned(raw, &std::free);
  std::memcpy(raw, data.data(), size);
  auto w = storage->open_writer("aligned.bin");
  w->append({static_cast<const std::byte*>(raw), size});
  w->commit();
  EXPECT_EQ(fs::file_size(dir.file("aligned.bin")), size);
  EXPECT_TRUE(read_text(dir.file("aligned.bin")) == data);
}

// Mounts a ramfs (which has no O_DIRECT) on a temporary directory; unmounts on destruction.
class RamfsMount {
 public:
  explicit RamfsMount(const std::string& dir) : dir_(dir) {
    mounted_ = ::geteuid() == 0 && ::mount("none", dir.c_str(), "ramfs", 0, nullptr) == 0;
  }
  ~RamfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

TEST(LocalStorageTest, FallsBackToBufferedWhereDirectIoIsRefused) {
  // /dev/shm (tmpfs) refused O_DIRECT before Linux 6.6; newer kernels accept it, so use a
  // ramfs there when we may mount one.
  TempDir mount_point;
  std::optional<TempDir> shm;
  std::unique_ptr<RamfsMount> ramfs;
  std::string root;
  if (fs::is_directory("/dev/shm") && filesystem_refuses_direct_io("/dev/shm")) {
    root = "/dev/shm/shardpoint-test-" + std::to_string(::getpid());
  } else {
    ramfs = std::make_unique<RamfsMount>(mount_point.path().string());
    if (!ramfs->mounted()) {
      GTEST_SKIP() << "no filesystem here refuses O_DIRECT "
                   << "(tmpfs accepts it since Linux 6.6; mounting a ramfs needs root)";
    }
    ASSERT_TRUE(filesystem_refuses_direct_io(mount_point.path().string()));
    root = mount_point.file("ckpt");
  }
  auto storage = open_local_storage_at(root);
  for (std::size_t size : {std::size_t{1}, std::size_t{4097}, (std::size_t{8} << 20) + 3}) {
    std::string data = pattern(size, 5);
    auto w = storage->open_writer("x/" + std::to_string(size));
    w->append(as_bytes(data));
    long flags = open_flags_of(root + "/x/" + std::to_string(size) + std::string(kTempMarker));
    ASSERT_NE(flags, -1);
    EXPECT_FALSE(flags & O_DIRECT);
    w->commit();
    EXPECT_EQ(fs::file_size(root + "/x/" + std::to_string(size)), size);
    EXPECT_TRUE(read_text(root + "/x/" + std::to_string(size)) == data);
  }
  auto w = storage->open_writer("par");
  w->write_at(5, as_bytes(std::string_view("hello")));
  w->commit();
  EXPECT_EQ(read_text(root + "/par"), std::string(5, '\0') + "hello");
  storage->remove_all();
  if (root.starts_with("/dev/shm/")) fs::remove_all(root);
}

TEST(LocalStorageTest, KeysAreFilesUnderTheRoot) {
  TempDir dir;
  auto storage = open_local_storage_at(dir.path().string() + "/");
  EXPECT_EQ(storage->url(), "file://" + dir.path().string());
  EXPECT_EQ(storage->local_path("a/b.distcp"), dir.file("a/b.distcp"));
  EXPECT_TRUE(storage->features().local_path);
  storage->write_atomic("a/b/c.bin", as_bytes(std::string_view("abc")));
  EXPECT_EQ(read_text(dir.file("a/b/c.bin")), "abc");
  write_text(dir.file("made-by-hand"), "xyz");
  EXPECT_EQ(storage->stat("made-by-hand"), 3u);
  try {
    storage->stat("nope/x");
    FAIL();
  } catch (const StorageError& e) {
    // Named once, as the driver describes it.
    EXPECT_EQ(std::string(e.what()), "stat local file \"" + dir.file("nope/x") + "\": No such file or directory");
  }
}

TEST(LocalStorageTest, StaleTempFilesFromACrashAreIgnoredAndCleaned) {
  TempDir dir;
  auto storage = open_local_storage_at(dir.path().string());
  // What a process killed mid-publish leaves behind: temporaries of .metadata and a shard.
  fs::create_directories(dir.path() / "step=3");
  write_text(dir.file(".metadata" + std::string(kTempMarker) + "99999.0"), "half-written metadata");
  write_text(dir.file("step=3/__0_0.distcp" + std::string(kTempMarker) + "99999.1"), "partial shard");
  EXPECT_TRUE(storage->list("").empty());
  EXPECT_FALSE(storage->try_stat(".metadata"));

  storage->write_atomic(".metadata", as_bytes(std::string_view("good metadata")));
  EXPECT_EQ(storage->list(""), (std::vector<ObjectInfo>{{".metadata", 13}}));
  std::string got(13, '\0');
  storage->read(".metadata", 0, std::as_writable_bytes(std::span(got)));
  EXPECT_EQ(got, "good metadata");

  EXPECT_EQ(storage->remove_all(), 1u);  // the temporaries go too, but are not counted
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(LocalStorageTest, RemovePrefixRemovesDirectoriesItEmpties) {
  TempDir dir;
  auto storage = open_local_storage_at(dir.path().string());
  for (std::string key : {"ckpt/step=1/a", "ckpt/step=1/deep/b", "ckpt/step=2/a", "ckpt/keep"}) {
    storage->write_atomic(key, as_bytes(std::string_view("x")));
  }
  EXPECT_EQ(storage->remove_prefix("ckpt/step=1/"), 2u);
  EXPECT_FALSE(fs::exists(dir.path() / "ckpt/step=1"));
  EXPECT_EQ(storage->remove_prefix("ckpt/step="), 1u);
  EXPECT_FALSE(fs::exists(dir.path() / "ckpt/step=2"));
  EXPECT_TRUE(fs::exists(dir.path() / "ckpt/keep"));
  EXPECT_EQ(storage->remove_all(), 1u);
  EXPECT_TRUE(fs::exists(dir.path()));
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(LocalStorageTest, UncommittedWriterRemovesItsTempFile) {
  TempDir dir;
  auto storage = open_local_storage_at(dir.path().string());
  {
    auto w = storage->open_writer("a/x");
    w->append(as_bytes(pattern(100000, 1)));
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.path() / "a"), fs::directory_iterator()), 1);
  }
  EXPECT_TRUE(fs::is_empty(dir.path() / "a"));
}

// Makes a directory read-only and restores it on destruction.
class ReadOnlyDir {
 public:
  explicit ReadOnlyDir(std::string dir) : dir_(std::move(dir)) { ::chmod(dir_.c_str(), 0500); }
  ~ReadOnlyDir() { ::chmod(dir_.c_str(), 0700); }

 private:
  std::string dir_;
};

TEST(LocalStorageTest, PermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores permission bits";
  TempDir dir;
  auto storage = open_local_storage_at(dir.path().string());
  ReadOnlyDir guard(dir.path().string());
  for (auto attempt : {+[](Storage& s) { s.open_writer("x"); },
                       +[](Storage& s) { s.write_atomic("x", as_bytes(std::string_view("x"))); }}) {
    try {
      attempt(*storage);
      FAIL() << "write into a read-only directory succeeded";
    } catch (const StorageError& e) {
      EXPECT_EQ(e.kind(), StorageError::Kind::kPermission) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir.path().string()), std::string::npos) << e.what();
    }
  }
}

TEST(LocalStorageTest, MmapLimitFallsBackToPread) {
  TempDir dir;
  StorageOptions options;
  options.max_mmaps = 1;
  auto storage = open_local_storage_at(dir.path().string(), options);
  storage->write_atomic("k", as_bytes(std::string_view("0123456789")));
  auto first = storage->open_source("k");
  EXPECT_TRUE(first->view(2, 3, "x").has_value());  // mapped: zero-copy view
  EXPECT_EQ(as_chars(*first->view(2, 3, "x")), "234");
  auto second = storage->open_source("k");
  EXPECT_FALSE(second->view(0, 1, "x").has_value());  // limit reached: pread
  EXPECT_EQ(second->read_string(7, 3, "x"), "789");
  first.reset();
  EXPECT_TRUE(storage->open_source("k")->view(0, 1, "x").has_value());
}

TEST(LocalStorageTest, WritersWaitForPoolBuffers) {
  TempDir dir;
  StorageOptions options;
  BufferPoolOptions pool_options;
  pool_options.buffer_bytes = 1 << 20;
  pool_options.capacity_bytes = 1 << 20;  // one buffer
  options.buffer_pool = std::make_shared<BufferPool>(pool_options);
  auto storage = open_local_storage_at(dir.path().string(), options);
  auto a = storage->open_writer("a");
  a->append(as_bytes(std::string_view("holds the only buffer")));
  auto b = storage->open_writer("b");
  auto start = std::chrono::steady_clock::now();
  try {
    b->append(as_bytes(std::string_view("waits")), IoOptions::with_timeout(std::chrono::milliseconds(50)));
    FAIL() << "second writer got a buffer from an empty pool";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kTransient) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
  {
    std::jthread committer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      a->commit();  // returns the buffer
    });
    b->append(as_bytes(std::string_view("waits")), IoOptions::with_timeout(std::chrono::seconds(30)));
  }
  b->commit();
  EXPECT_EQ(read_text(dir.file("b")), "waits");
  EXPECT_EQ(options.buffer_pool->allocated_buffers(), 1u);

  // A writer whose staged bytes all reached the file holds no buffer.
  auto c = storage->open_writer("c");
  c->append(as_bytes(pattern(1 << 20, 3)).first(1000));
  c->append(as_bytes(pattern(1 << 20, 3)).subspan(1000));  // fills and flushes the buffer
  auto d = storage->open_writer("d");
  d->append(as_bytes(std::string_view("no wait")), IoOptions::with_timeout(std::chrono::seconds(5)));
  d->commit();
  c->commit();
  EXPECT_TRUE(read_text(dir.file("c")) == pattern(1 << 20, 3));
}

TEST(LocalStorageTest, FullBuffersAreWrittenInTheBackgroundAndCommitWaitsForThem) {
  TempDir dir;
  StorageOptions options;
  BufferPoolOptions pool_options;
  pool_options.buffer_bytes = 64 << 10;
  pool_options.capacity_bytes = 16 << 20;
  options.buffer_pool = std::make_shared<BufferPool>(pool_options);
  auto storage = open_local_storage_at(dir.path().string(), options);
  const std::string data = pattern((5 << 20) + 12345, 11);
  auto w = storage->open_writer("bg");
  for (std::size_t pos = 0; pos < data.size();) {
    const std::size_t n = std::min<std::size_t>(data.size() - pos, 100003);
    w->append(as_bytes(std::string_view(data).substr(pos, n)));
    pos += n;
  }
  w->commit();
  EXPECT_TRUE(read_text(dir.file("bg")) == data);
  // One full buffer being written, plus the one being filled.
  EXPECT_LE(options.buffer_pool->allocated_buffers(), 2u);
  EXPECT_EQ(options.buffer_pool->leased_buffers(), 0u);
}

TEST(LocalStorageTest, FailedBackgroundWriteFailsTheWriterNamingTheFile) {
  TempDir dir;
  StorageOptions options;
  BufferPoolOptions pool_options;
  pool_options.buffer_bytes = 64 << 10;
  options.buffer_pool = std::make_shared<BufferPool>(pool_options);
  auto storage = open_local_storage_at(dir.path().string(), options);
  // Files of this process may not grow past 256 KiB: the background pwrite gets EFBIG.
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 256 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    auto w = storage->open_writer("big");
    const std::string piece = pattern(100000, 5);
    for (int i = 0; i < 40; ++i) w->append(as_bytes(piece));
    w->commit();
  } catch (const StorageError& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(error.find("write local file \"" + dir.file("big") + "\""), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir.file("big")));
  EXPECT_EQ(options.buffer_pool->leased_buffers(), 0u);
}

TEST(LocalStorageTest, RejectsBadFileUrls) {
  EXPECT_THROW(open_local_storage(Location::parse("file://otherhost/x"), {}), UsageError);
  EXPECT_THROW(open_local_storage(Location::parse("file:///x?query=1"), {}), UsageError);
  EXPECT_THROW(open_local_storage(Location::parse("file:///x#frag"), {}), UsageError);
  EXPECT_THROW(open_local_storage_at("", {}), UsageError);
  EXPECT_EQ(open_local_storage(Location::parse("file://localhost/tmp/x"), {})->url(), "file:///tmp/x");
  EXPECT_EQ(open_local_storage(Location::parse("file:///tmp/x/../y/"), {})->url(), "file:///tmp/y");
}

TEST(LocalStorageTest, NonDurableWritesStillPublish) {
  TempDir dir;
  auto storage = open_local_storage_at(dir.path().string());
  WriteOptions fast;
  fast.durable = false;
  fast.direct_io = false;
  auto w = storage->open_writer("n/x", fast);
  w->append(as_bytes(std::string_view("quick")));
  w->commit();
  storage->write_atomic("n/y", as_bytes(std::string_view("also")), fast);
  EXPECT_EQ(read_text(dir.file("n/x")), "quick");
  EXPECT_EQ(read_text(dir.file("n/y")), "also");
}

}  // namespace
}  // namespace shardpoint::storage
