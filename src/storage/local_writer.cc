#include "storage/local_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <thread>

#include "shardpoint/error.h"
#include "shardpoint/mutex.h"

namespace shardpoint::storage::local {
namespace {

// Largest single pwrite from caller memory, so cancellation is checked between chunks.
constexpr std::size_t kMaxChunk = std::size_t{64} << 20;
// Full append() buffers queued or being written per file while the caller fills the next.
// One is enough (double buffering): the caller's copy and checksums run at several GB/s, the
// device's share per rank is a fraction of that. Each extra buffer is first-touch memory that
// a one-shot save pays for in page faults.
constexpr std::size_t kBuffersInFlight = 1;

std::uint64_t round_down(std::uint64_t n) { return n / kDirectAlign * kDirectAlign; }
std::uint64_t round_up(std::uint64_t n) { return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }
bool is_aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kDirectAlign == 0; }

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
      MutexLock lock(mu_);
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
    MutexLock lock(mu_);
    changed_.wait(mu_, [&]() SP_REQUIRES(mu_) { return error_ || pending_locked() < max_in_flight_; });
    if (error_) std::rethrow_exception(error_);
    queue_.push_back(Job{std::move(lease), size, offset});
    lock.unlock();
    changed_.notify_all();
  }

  // Waits until every queued write is done; rethrows the first failure.
  void drain() {
    MutexLock lock(mu_);
    changed_.wait(mu_, [&]() SP_REQUIRES(mu_) { return error_ || pending_locked() == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Job {
    BufferPool::Lease lease;
    std::size_t size = 0;
    std::uint64_t offset = 0;
  };

  std::size_t pending_locked() const SP_REQUIRES(mu_) { return queue_.size() + (busy_ ? 1 : 0); }

  void run() {
    MutexLock lock(mu_);
    while (true) {
      changed_.wait(mu_, [&]() SP_REQUIRES(mu_) { return stop_ || !queue_.empty(); });
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
  Mutex mu_;
  CondVar changed_;
  std::deque<Job> queue_ SP_GUARDED_BY(mu_);
  bool busy_ SP_GUARDED_BY(mu_) = false;  // the thread is writing a job
  bool stop_ SP_GUARDED_BY(mu_) = false;
  std::exception_ptr error_ SP_GUARDED_BY(mu_);  // the first failed write
  std::thread thread_;                           // last: starts after the members it uses
};

class LocalWriter final : public StorageWriter {
 public:
  LocalWriter(std::shared_ptr<LocalRoot> shared, std::string key, const WriteOptions& options)
      : shared_(std::move(shared)),
        key_(std::move(key)),
        path_(shared_->path_of(key_)),
        description_(describe_path(path_)),
        tmp_path_(temp_path_for(path_)),
        durable_(options.durable),
        if_absent_(options.if_absent) {
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
    {
      MutexLock lock(mu_);
      buffered_fd_.close();
    }
    fd_.close();  // reports a delayed write error
    // 2. rename atomically replaces any previous object under the key (with if_absent only
    //    when there is none).
    publish_file(tmp_path_, path_, if_absent_, description_);
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
      MutexLock lock(mu_);
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
    MutexLock lock(mu_);
    if (!buffered_fd_.valid()) buffered_fd_ = open_or_throw(tmp_path_, O_WRONLY, description_);
    return buffered_fd_.get();
  }

  // Declared first: destroyed last, after the lease that points into its pool.
  std::shared_ptr<LocalRoot> shared_;
  const std::string key_;
  const std::string path_;
  const std::string description_;
  const std::string tmp_path_;
  const bool durable_;
  const bool if_absent_;  // WriteOptions::if_absent

  Mutex mu_;  // guards opening buffered_fd_ and the O_DIRECT -> buffered switch
  UniqueFd fd_;
  UniqueFd buffered_fd_ SP_GUARDED_BY(mu_);  // opened by the first write_at() edge
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

}  // namespace

std::unique_ptr<StorageWriter> open_local_writer(std::shared_ptr<LocalRoot> root, std::string key,
                                                 const WriteOptions& options) {
  return std::make_unique<LocalWriter>(std::move(root), std::move(key), options);
}

}  // namespace shardpoint::storage::local
