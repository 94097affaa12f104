#include "storage/local_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "core/buffer_pool.h"
#include "core/byte_stream.h"
#include "core/mapped_region.h"
#include "core/unique_fd.h"
#include "shardpoint/error.h"
#include "storage/location.h"

namespace shardpoint::storage {
namespace {

// O_DIRECT alignment of file offsets, lengths and buffer addresses. 4096 covers every
// logical block size we meet; the pool's buffers are aligned to it.
constexpr std::uint64_t kAlign = 4096;
// Largest single pwrite from caller memory, so cancellation is checked between chunks.
constexpr std::size_t kMaxChunk = std::size_t{64} << 20;
// Full append() buffers queued or being written per file while the caller fills the next.
// One is enough (double buffering): the caller's copy and checksums run at several GB/s, the
// device's share per rank is a fraction of that. Each extra buffer is first-touch memory that
// a one-shot save pays for in page faults.
constexpr std::size_t kBuffersInFlight = 1;

std::uint64_t round_down(std::uint64_t n) { return n / kAlign * kAlign; }
std::uint64_t round_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
bool is_aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kAlign == 0; }

std::string describe_path(std::string_view path) { return "local file \"" + std::string(path) + "\""; }
std::string describe_dir(std::string_view path) { return "local directory \"" + std::string(path) + "\""; }

// The directory holding `path`. REQUIRES path is absolute and not "/" (every path here is
// the root joined with a key).
std::string parent_dir(const std::string& path) { return Location::parse(path).parent()->to_string(); }

// Process-wide, so two LocalStorage objects on one directory never pick the same name.
std::atomic<std::uint64_t> g_tmp_counter{0};

std::string temp_path_for(const std::string& path) {
  return path + std::string(kTempMarker) + std::to_string(::getpid()) + "." +
         std::to_string(g_tmp_counter.fetch_add(1, std::memory_order_relaxed));
}

// open() with EINTR retry; returns the fd or -errno.
int open_raw(const std::string& path, int flags, mode_t mode = 0644) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd >= 0 ? fd : -errno;
}

UniqueFd open_or_throw(const std::string& path, int flags, const std::string& description) {
  int fd = open_raw(path, flags);
  if (fd < 0) throw_os_error("open", description, -fd);
  return UniqueFd(fd, description);
}

// pwrite of all of data; returns 0 or the errno of the failing call.
int pwrite_raw(int fd, const std::byte* data, std::size_t size, std::uint64_t offset) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return 0;
}

// mkdir -p. Each directory created is made durable by an fsync of its parent when asked,
// so a committed file is never left in a directory entry that a crash forgets.
void make_dirs(const std::string& dir, bool durable) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return;
    throw StorageError(StorageError::Kind::kOther, "mkdir " + describe_dir(dir) + ": exists and is not a directory");
  }
  if (errno != ENOENT) throw_os_error("stat", describe_dir(dir), errno);
  const std::string parent = parent_dir(dir);
  make_dirs(parent, durable);
  if (::mkdir(dir.c_str(), 0755) != 0) {
    if (errno == EEXIST) return;  // another thread made it
    throw_os_error("mkdir", describe_dir(dir), errno);
  }
  if (durable) fsync_directory(parent);
}

struct Shared {
  std::string root;  // absolute, normalized, no trailing '/' (unless "/")
  StorageOptions options;
  std::shared_ptr<BufferPool> pool;
  // Set once a filesystem under root refused O_DIRECT; later writers go buffered.
  std::atomic<bool> direct_refused{false};
  std::atomic<std::size_t> mmaps{0};

  std::string path_of(std::string_view key) const {
    return root == "/" ? "/" + std::string(key) : root + "/" + std::string(key);
  }
};

// Writes filled staging buffers on a thread of its own, so the caller copies and checksums
// the next buffer while the device writes the last one. With synchronous pwrite a writer's
// device queue sat empty during every copy and checksum. At most `max_in_flight` buffers wait
// or are being written (the caller's own buffer comes on top), so a writer holds at most
// max_in_flight + 1 pool buffers.
class BackgroundWrites {
 public:
  using WriteFn = std::function<void(const std::byte* data, std::size_t size, std::uint64_t offset)>;

  BackgroundWrites(WriteFn write, std::size_t max_in_flight)
      : write_(std::move(write)), max_in_flight_(std::max<std::size_t>(max_in_flight, 1)), thread_([this] { run(); }) {}

  // Abandons the writes not started yet (an uncommitted file is deleted anyway), waits for
  // the one under way, and returns every buffer to the pool.
  ~BackgroundWrites() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      queue_.clear();
    }
    changed_.notify_all();
    thread_.join();
  }

  BackgroundWrites(const BackgroundWrites&) = delete;
  BackgroundWrites& operator=(const BackgroundWrites&) = delete;

  // Queues the write of lease[0, size) at offset; waits while max_in_flight are pending.
  // Rethrows the failure of an earlier write (and then drops this one).
  void submit(BufferPool::Lease lease, std::size_t size, std::uint64_t offset) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return error_ || pending_locked() < max_in_flight_; });
    if (error_) std::rethrow_exception(error_);
    queue_.push_back(Job{std::move(lease), size, offset});
    lock.unlock();
    changed_.notify_all();
  }

  // Waits until every queued write is done; rethrows the first failure.
  void drain() {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return error_ || pending_locked() == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Job {
    BufferPool::Lease lease;
    std::size_t size = 0;
    std::uint64_t offset = 0;
  };

  std::size_t pending_locked() const { return queue_.size() + (busy_ ? 1 : 0); }

  void run() {
    std::unique_lock lock(mu_);
    while (true) {
      changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr failed;
      try {
        write_(job.lease.data(), job.size, job.offset);
      } catch (...) {
        failed = std::current_exception();
      }
      job.lease.release();
      lock.lock();
      busy_ = false;
      if (failed && !error_) error_ = failed;
      if (error_) queue_.clear();  // nothing after a failed write is worth writing
      changed_.notify_all();
    }
  }

  const WriteFn write_;
  const std::size_t max_in_flight_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Job> queue_;        // GUARDED_BY(mu_)
  bool busy_ = false;            // GUARDED_BY(mu_): the thread is writing a job
  bool stop_ = false;            // GUARDED_BY(mu_)
  std::exception_ptr error_;     // GUARDED_BY(mu_): the first failed write
  std::thread thread_;           // last: starts after the members it uses
};

class LocalWriter final : public StorageWriter {
 public:
  LocalWriter(std::shared_ptr<Shared> shared, std::string key, const WriteOptions& options)
      : shared_(std::move(shared)),
        key_(std::move(key)),
        path_(shared_->path_of(key_)),
        description_(describe_path(path_)),
        tmp_path_(temp_path_for(path_)),
        durable_(options.durable) {
    make_dirs(parent_dir(path_), durable_);
    const int flags = O_WRONLY | O_CREAT | O_EXCL;
    bool want_direct = options.direct_io && shared_->options.direct_io && !shared_->direct_refused.load();
    if (want_direct) {
      int fd = open_raw(tmp_path_, flags | O_DIRECT);
      if (fd >= 0) {
        fd_ = UniqueFd(fd, description_);
        direct_ = true;
        return;
      }
      if (-fd != EINVAL) throw_os_error("open", description_, -fd);
      // The filesystem refuses O_DIRECT (the file may already have been created by the
      // failed open): remember, and go buffered.
      shared_->direct_refused.store(true);
      ::unlink(tmp_path_.c_str());
    }
    fd_ = open_or_throw(tmp_path_, flags, description_);
  }

  ~LocalWriter() override {
    background_.reset();  // joins its thread; its buffers go back to the pool
    if (committed_) return;
    // Uncommitted: the partial object must not survive. Errors cannot be reported here and
    // change nothing (a leftover temporary file is ignored by list()).
    lease_.release();
    fd_.reset();
    buffered_fd_.reset();
    ::unlink(tmp_path_.c_str());
  }

  void append(ByteSpan data, const IoOptions& io) override {
    check_open("append");
    int expected = kModeNone;
    if (!mode_.compare_exchange_strong(expected, kModeAppend) && expected != kModeAppend) {
      throw UsageError("append " + description_ + ": writer already used with write_at()");
    }
    while (!data.empty()) {
      if (io_expired(io)) check_io(io, "write " + description_);
      // Large caller buffers go straight to the file when the alignment allows (no copy).
      if (fill_ == 0 && data.size() >= pool().buffer_bytes() && (!direct_ || is_aligned(data.data()))) {
        std::size_t n = std::min(data.size(), kMaxChunk);
        if (direct_) n = round_down(n);
        write_block(data.data(), n, appended_);
        appended_ += n;
        data = data.subspan(n);
        continue;
      }
      if (!lease_) lease_ = pool().acquire(io.deadline, io.stop);
      std::size_t n = std::min(data.size(), lease_.size() - fill_);
      std::memcpy(lease_.data() + fill_, data.data(), n);
      fill_ += n;
      data = data.subspan(n);
      if (fill_ == lease_.size()) {
        // The full buffer goes to the background thread, which returns it to the pool once
        // written: idle open writers hold no buffer, and the next append takes a fresh one
        // (one uncontended lock per buffer).
        background().submit(std::move(lease_), fill_, appended_);
        appended_ += fill_;
        fill_ = 0;
      }
    }
  }

  void write_at(std::uint64_t offset, ByteSpan data, const IoOptions& io) override {
    check_open("write_at");
    int expected = kModeNone;
    if (!mode_.compare_exchange_strong(expected, kModeRandom) && expected != kModeRandom) {
      throw UsageError("write_at " + description_ + ": writer already used with append()");
    }
    const std::uint64_t end = offset + data.size();
    std::uint64_t seen = max_end_.load();
    while (seen < end && !max_end_.compare_exchange_weak(seen, end)) {
    }
    if (data.empty()) return;

    if (!direct_.load()) {
      write_chunks_buffered(fd_.get(), offset, data, io);
      return;
    }
    // O_DIRECT needs aligned offsets and lengths: the aligned middle goes direct; the head
    // and tail partial blocks, which neighbouring items may share, go through the page
    // cache on a second descriptor (the kernel keeps both coherent: the direct range never
    // covers those pages).
    const std::uint64_t mid_begin = std::min(round_up(offset), end);
    const std::uint64_t mid_end = std::max(round_down(end), mid_begin);
    if (mid_begin > offset) {
      write_chunks_buffered(buffered_fd(), offset, data.first(mid_begin - offset), io);
    }
    if (mid_end > mid_begin) {
      ByteSpan mid = data.subspan(mid_begin - offset, mid_end - mid_begin);
      if (is_aligned(mid.data())) {
        for (std::size_t done = 0; done < mid.size();) {
          if (io_expired(io)) check_io(io, "write " + description_);
          std::size_t n = std::min(mid.size() - done, kMaxChunk);
          write_block(mid.data() + done, n, mid_begin + done);
          done += n;
        }
      } else {
        BufferPool::Lease lease = pool().acquire(io.deadline, io.stop);
        for (std::size_t done = 0; done < mid.size();) {
          if (io_expired(io)) check_io(io, "write " + description_);
          std::size_t n = std::min(mid.size() - done, lease.size());
          std::memcpy(lease.data(), mid.data() + done, n);
          write_block(lease.data(), n, mid_begin + done);
          done += n;
        }
      }
    }
    if (end > mid_end) {
      write_chunks_buffered(buffered_fd(), mid_end, data.subspan(mid_end - offset), io);
    }
  }

  std::uint64_t position() const override { return appended_ + fill_; }

  void commit(const IoOptions& io) override {
    check_open("commit");
    if (io_expired(io)) check_io(io, "commit " + description_);
    std::uint64_t size;
    if (mode_.load() == kModeRandom) {
      size = max_end_.load();
    } else {
      if (background_) background_->drain();  // every full buffer is in the file
      size = appended_ + fill_;
      if (fill_ > 0) {
        // The last partial block: O_DIRECT can only write whole blocks, so pad it with
        // zeros; ftruncate below cuts the file back to its exact size.
        std::size_t n = fill_;
        if (direct_) {
          n = static_cast<std::size_t>(round_up(fill_));
          std::memset(lease_.data() + fill_, 0, n - fill_);
        }
        write_block(lease_.data(), n, appended_);
        appended_ += fill_;
        fill_ = 0;
      }
    }
    lease_.release();
    if (::ftruncate(fd_.get(), static_cast<off_t>(size)) != 0) throw_os_error("truncate", description_, errno);
    // 1. fsync the data before the rename, or a crash after the rename could leave the key
    //    naming a file whose blocks never reached the disk. One fsync covers both
    //    descriptors: they share the inode.
    if (durable_) fd_.fsync();
    buffered_fd_.close();
    fd_.close();  // reports a delayed write error
    // 2. rename atomically replaces any previous object under the key.
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) throw_os_error("rename", description_, errno);
    committed_ = true;
    // 3. fsync the directory so the new name survives a crash.
    if (durable_) fsync_directory(parent_dir(path_));
  }

  const std::string& key() const override { return key_; }

 private:
  enum { kModeNone, kModeAppend, kModeRandom };

  BufferPool& pool() const { return *shared_->pool; }

  BackgroundWrites& background() {
    if (!background_) {
      background_ = std::make_unique<BackgroundWrites>(
          [this](const std::byte* data, std::size_t size, std::uint64_t offset) { write_block(data, size, offset); },
          kBuffersInFlight);
    }
    return *background_;
  }

  void check_open(std::string_view op) const {
    if (committed_) throw UsageError(std::string(op) + " " + description_ + ": writer already committed");
  }

  // Writes [data, data+size) at offset on the main descriptor. A filesystem that accepted
  // O_DIRECT at open but refuses the write (EINVAL) switches this file, and the storage, to
  // buffered I/O.
  void write_block(const std::byte* data, std::size_t size, std::uint64_t offset) {
    int err = pwrite_raw(fd_.get(), data, size, offset);
    if (err == EINVAL && direct_.load()) {
      std::lock_guard lock(mu_);
      if (direct_.load()) {
        int flags = ::fcntl(fd_.get(), F_GETFL);
        if (flags < 0 || ::fcntl(fd_.get(), F_SETFL, flags & ~O_DIRECT) != 0) {
          throw_os_error("fcntl", description_, errno);
        }
        direct_.store(false);
        shared_->direct_refused.store(true);
      }
      err = pwrite_raw(fd_.get(), data, size, offset);
    }
    if (err != 0) throw_os_error("write", description_, err);
  }

  void write_chunks_buffered(int fd, std::uint64_t offset, ByteSpan data, const IoOptions& io) {
    for (std::size_t done = 0; done < data.size();) {
      if (io_expired(io)) check_io(io, "write " + description_);
      std::size_t n = std::min(data.size() - done, kMaxChunk);
      int err = pwrite_raw(fd, data.data() + done, n, offset + done);
      if (err != 0) throw_os_error("write", description_, err);
      done += n;
    }
  }

  int buffered_fd() {
    std::lock_guard lock(mu_);
    if (!buffered_fd_.valid()) buffered_fd_ = open_or_throw(tmp_path_, O_WRONLY, description_);
    return buffered_fd_.get();
  }

  // Declared first: destroyed last, after the lease that points into its pool.
  std::shared_ptr<Shared> shared_;
  const std::string key_;
  const std::string path_;
  const std::string description_;
  const std::string tmp_path_;
  const bool durable_;

  std::mutex mu_;  // guards opening buffered_fd_ and the O_DIRECT -> buffered switch
  UniqueFd fd_;
  UniqueFd buffered_fd_;  // GUARDED_BY(mu_) while opening; write_at() edges only
  std::atomic<bool> direct_{false};
  std::atomic<int> mode_{kModeNone};
  bool committed_ = false;

  // append() state (single-threaded).
  BufferPool::Lease lease_;
  std::size_t fill_ = 0;
  std::uint64_t appended_ = 0;  // bytes handed to the file by append() (written, or queued)
  // Writes the full append() buffers; created at the first one. Declared after everything
  // its writes use, so it is destroyed (its thread joined) first.
  std::unique_ptr<BackgroundWrites> background_;
  // write_at() state.
  std::atomic<std::uint64_t> max_end_{0};
};

using DirPtr = std::unique_ptr<DIR, int (*)(DIR*)>;

class LocalStorage final : public Storage {
 public:
  explicit LocalStorage(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

  StorageFeatures features() const override {
    StorageFeatures f;
    f.range_reads = true;
    f.atomic_publish = true;
    f.direct_io = shared_->options.direct_io;
    f.local_path = true;
    f.parallel_writes = true;
    return f;
  }

  std::string url() const override { return "file://" + shared_->root; }

  std::string describe_key(std::string_view key) const override { return describe_path(shared_->path_of(key)); }

  std::optional<std::string> local_path(std::string_view key) const override {
    validate_key(key);
    return shared_->path_of(key);
  }

  std::uint64_t stat(std::string_view key, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "stat " + describe_key(key));
    std::string path = shared_->path_of(key);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      throw_os_error("stat", describe_path(path), errno == ENOTDIR ? ENOENT : errno);
    }
    if (!S_ISREG(st.st_mode)) {
      throw StorageError(StorageError::Kind::kNotFound, "stat " + describe_path(path) + ": not a regular file");
    }
    return static_cast<std::uint64_t>(st.st_size);
  }

  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "read " + describe_key(key));
    UniqueFd fd = open_read(key);
    fd.pread_exact(out, offset, "read");
  }

  std::unique_ptr<ByteSource> open_source(std::string_view key, const SourceOptions& options,
                                          const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "open " + describe_key(key));
    UniqueFd fd = open_read(key);
    std::string description = fd.path();
    std::uint64_t size = fd.size();
    // Map unless the mapping limit is reached (then pread, as LevelDB's mmap limiter).
    if (options.prefer_mmap && size > 0) {
      if (shared_->mmaps.fetch_add(1) < shared_->options.max_mmaps) {
        try {
          auto region = std::shared_ptr<const MappedRegion>(
              new MappedRegion(MappedRegion::map_file(shared_->path_of(key))),
              [shared = shared_](const MappedRegion* r) {
                delete r;
                shared->mmaps.fetch_sub(1);
              });
          std::uint64_t mapped = region->size();
          return std::make_unique<MappedSource>(std::move(region), 0, mapped, description);
        } catch (...) {
          shared_->mmaps.fetch_sub(1);
          throw;
        }
      }
      shared_->mmaps.fetch_sub(1);
    }
    return std::make_unique<FileSource>(std::make_shared<const UniqueFd>(std::move(fd)), 0, size, description);
  }

  std::unique_ptr<StorageWriter> open_writer(std::string_view key, const WriteOptions& options,
                                             const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "open " + describe_key(key));
    return std::make_unique<LocalWriter>(shared_, std::string(key), options);
  }

  void write_atomic(std::string_view key, ByteSpan data, const WriteOptions& options, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "write " + describe_key(key));
    const std::string path = shared_->path_of(key);
    const std::string description = describe_path(path);
    make_dirs(parent_dir(path), options.durable);
    // 1. Write a temporary file next to the target (same filesystem, so rename is atomic).
    const std::string tmp = temp_path_for(path);
    UniqueFd fd = open_or_throw(tmp, O_WRONLY | O_CREAT | O_EXCL, description);
    bool renamed = false;
    try {
      if (int err = pwrite_raw(fd.get(), data.data(), data.size(), 0); err != 0) {
        throw_os_error("write", description, err);
      }
      // 2. fsync it, so the name never points at data that is not on disk.
      if (options.durable) fd.fsync();
      fd.close();
      // 3. rename over the target: readers see the old file or the new one.
      if (::rename(tmp.c_str(), path.c_str()) != 0) throw_os_error("rename", description, errno);
      renamed = true;
      // 4. fsync the directory, so the rename itself survives a crash.
      if (options.durable) fsync_directory(parent_dir(path));
    } catch (...) {
      if (!renamed) ::unlink(tmp.c_str());
      throw;
    }
  }

  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io) override {
    validate_prefix(prefix);
    std::vector<ObjectInfo> out;
    walk(prefix, io, [&](const std::string& key, const struct stat& st, bool is_temp) {
      if (!is_temp && key.starts_with(prefix)) out.push_back({key, static_cast<std::uint64_t>(st.st_size)});
    });
    std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  void remove(std::string_view key, const IoOptions& io) override {
    validate_key(key);
    if (io_expired(io)) check_io(io, "remove " + describe_key(key));
    std::string path = shared_->path_of(key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT && errno != ENOTDIR && errno != EISDIR) {
      throw_os_error("remove", describe_path(path), errno);
    }
  }

  std::size_t remove_prefix(std::string_view prefix, const IoOptions& io) override {
    validate_prefix(prefix);
    std::size_t removed = 0;
    std::vector<std::pair<std::string, bool>> victims;  // (key, is_temp)
    walk(prefix, io, [&](const std::string& key, const struct stat&, bool is_temp) {
      // A temporary file belongs to the key before its marker.
      std::string_view owner = std::string_view(key).substr(0, key.find(kTempMarker));
      if (owner.starts_with(prefix)) victims.emplace_back(key, is_temp);
    });
    for (const auto& [key, is_temp] : victims) {
      std::string path = shared_->path_of(key);
      if (::unlink(path.c_str()) != 0) {
        if (errno == ENOENT) continue;
        throw_os_error("remove", describe_path(path), errno);
      }
      if (!is_temp) ++removed;
    }
    prune_empty_dirs(prefix);
    return removed;
  }

 private:
  UniqueFd open_read(std::string_view key) const {
    std::string path = shared_->path_of(key);
    std::string description = describe_path(path);
    int fd = open_raw(path, O_RDONLY);
    if (fd < 0) throw_os_error("open", description, -fd == ENOTDIR ? ENOENT : -fd);
    UniqueFd ufd(fd, description);
    struct stat st;
    if (::fstat(fd, &st) != 0) throw_os_error("stat", description, errno);
    if (!S_ISREG(st.st_mode)) {
      throw StorageError(StorageError::Kind::kNotFound, "open " + description + ": not a regular file");
    }
    return ufd;
  }

  // Calls fn(key, stat, is_temp) for every regular file under the directory part of prefix
  // whose key could start with prefix. A missing directory yields nothing.
  template <typename Fn>
  void walk(std::string_view prefix, const IoOptions& io, Fn&& fn) {
    std::size_t slash = prefix.rfind('/');
    std::string dir_key = slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash + 1));
    walk_dir(dir_key, prefix, io, fn);
  }

  template <typename Fn>
  void walk_dir(const std::string& dir_key, std::string_view prefix, const IoOptions& io, Fn& fn) {
    std::string dir = dir_key.empty() ? shared_->root : shared_->path_of(dir_key.substr(0, dir_key.size() - 1));
    if (io_expired(io)) check_io(io, "list " + describe_dir(dir));
    DirPtr d(::opendir(dir.c_str()), &::closedir);
    if (!d) {
      if (errno == ENOENT || errno == ENOTDIR) return;
      throw_os_error("list", describe_dir(dir), errno);
    }
    std::vector<std::string> subdirs;
    while (true) {
      errno = 0;
      struct dirent* e = ::readdir(d.get());
      if (e == nullptr) {
        if (errno != 0) throw_os_error("list", describe_dir(dir), errno);
        break;
      }
      std::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      std::string key = dir_key + std::string(name);
      struct stat st;
      if (::fstatat(::dirfd(d.get()), e->d_name, &st, 0) != 0) {
        if (errno == ENOENT) continue;  // removed while we listed
        throw_os_error("stat", describe_path(shared_->path_of(key)), errno);
      }
      if (S_ISDIR(st.st_mode)) {
        std::string sub = key + "/";
        if (sub.starts_with(prefix) || prefix.starts_with(sub)) subdirs.push_back(std::move(sub));
      } else if (S_ISREG(st.st_mode)) {
        fn(key, st, name.find(kTempMarker) != std::string_view::npos);
      }
    }
    d.reset();
    for (const std::string& sub : subdirs) walk_dir(sub, prefix, io, fn);
  }

  // Removes directories under prefix left empty, deepest first; never the root.
  void prune_empty_dirs(std::string_view prefix) {
    std::size_t slash = prefix.rfind('/');
    std::string dir_key = slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash + 1));
    prune_dir(dir_key, prefix);
    // The prefix "a/" names the directory "a" itself: it goes too when empty.
    if (!dir_key.empty() && dir_key == prefix) ::rmdir(shared_->path_of(dir_key.substr(0, dir_key.size() - 1)).c_str());
  }

  void prune_dir(const std::string& dir_key, std::string_view prefix) {
    std::string dir = dir_key.empty() ? shared_->root : shared_->path_of(dir_key.substr(0, dir_key.size() - 1));
    std::vector<std::string> subdirs;
    {
      DirPtr d(::opendir(dir.c_str()), &::closedir);
      if (!d) return;
      while (struct dirent* e = ::readdir(d.get())) {
        std::string_view name = e->d_name;
        if (name == "." || name == "..") continue;
        std::string sub = dir_key + std::string(name) + "/";
        struct stat st;
        if (::fstatat(::dirfd(d.get()), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
            (sub.starts_with(prefix) || prefix.starts_with(sub))) {
          subdirs.push_back(std::move(sub));
        }
      }
    }
    for (const std::string& sub : subdirs) {
      prune_dir(sub, prefix);
      // Only directories wholly inside the prefix go; ENOTEMPTY means something else lives there.
      if (sub.starts_with(prefix)) ::rmdir(shared_->path_of(sub.substr(0, sub.size() - 1)).c_str());
    }
  }

  std::shared_ptr<Shared> shared_;
};

}  // namespace

std::unique_ptr<Storage> open_local_storage_at(const std::string& root, const StorageOptions& options) {
  if (root.empty()) throw UsageError("local storage: empty directory path");
  auto shared = std::make_shared<Shared>();
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(root, ec);
  if (ec) throw UsageError("local storage \"" + root + "\": " + ec.message());
  std::string normalized = abs.lexically_normal().string();
  while (normalized.size() > 1 && normalized.back() == '/') normalized.pop_back();
  shared->root = normalized;
  shared->options = options;
  shared->pool = options.buffer_pool;
  if (!shared->pool) {
    BufferPoolOptions pool_options;
    // 4 MiB O_DIRECT writes reach the disk ceiling (fio reaches it with 1 MiB), and a writer
    // touches only two buffers (filling + being written).
    pool_options.buffer_bytes = std::size_t{4} << 20;
    pool_options.capacity_bytes = options.default_pool_bytes;
    shared->pool = std::make_shared<BufferPool>(pool_options);
  }
  if (shared->pool->alignment() % kAlign != 0) {
    throw UsageError("local storage: buffer pool alignment " + std::to_string(shared->pool->alignment()) +
                     " is not a multiple of " + std::to_string(kAlign) + " (needed for O_DIRECT)");
  }
  return std::make_unique<LocalStorage>(std::move(shared));
}

std::unique_ptr<Storage> open_local_storage(std::string_view url, const StorageOptions& options) {
  // Location's rules for "file://" URLs and their UsageErrors.
  if (!url.empty()) {
    const Location location = Location::parse(url);
    if (!location.is_remote()) return open_local_storage_at(location.path(), options);
  }
  return open_local_storage_at(std::string(url), options);
}

namespace {
const StorageRegistration kFileRegistration{"file", &open_local_storage};
}  // namespace

}  // namespace shardpoint::storage
