#include "storage/http/upload_writer.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
#include <stop_token>

#include "shardpoint/error.h"

namespace shardpoint::storage::http {
namespace {

class UploadWriter final : public StorageWriter {
 public:
  UploadWriter(std::string key, std::string name, std::shared_ptr<PartUpload> upload, std::shared_ptr<BufferPool> pool,
               UploadLimits limits)
      : key_(std::move(key)),
        name_(std::move(name)),
        upload_(std::move(upload)),
        pool_(std::move(pool)),
        limits_(limits) {
    limits_.part_bytes = std::clamp<std::size_t>(limits_.part_bytes, 1, pool_->buffer_bytes());
    limits_.parts_in_flight = std::max(1, limits_.parts_in_flight);
    part_bytes_ = limits_.part_bytes;
  }

  ~UploadWriter() override {
    if (!published_) abandon();
  }

  void append(ByteSpan data, const IoOptions& io) override {
    check_open("append");
    if (io_expired(io)) check_io(io, "write " + name_);
    try {
      while (!data.empty()) {
        if (!buffer_) {
          reap_finished();  // a failed part fails the writer now, not at commit
          buffer_ = staging_pool().acquire(io.deadline, io.stop);
          fill_ = 0;
        }
        std::size_t n = std::min(data.size(), part_bytes_ - fill_);
        std::memcpy(buffer_.data() + fill_, data.data(), n);
        fill_ += n;
        position_ += n;
        data = data.subspan(n);
        // A full buffer waits for more bytes: an object of exactly one part stays one request.
        if (fill_ == part_bytes_ && !data.empty()) send_part(io, /*last=*/false);
      }
    } catch (...) {
      failed_ = true;
      throw;
    }
  }

  std::uint64_t position() const override { return position_; }

  void commit(const IoOptions& io) override {
    check_open("commit");
    committed_ = true;  // single use, even when this commit fails
    try {
      if (io_expired(io)) check_io(io, "commit " + name_);
      ByteSpan rest = buffer_ ? ByteSpan(buffer_.data(), fill_) : ByteSpan();
      if (!started_) {
        upload_->put_whole(rest, io);
      } else if (limits_.tail_in_finish) {
        wait_all();
        upload_->finish(parts_, position_, rest, io);
      } else {
        if (fill_ > 0) send_part(io, /*last=*/true);
        wait_all();
        upload_->finish(parts_, position_, {}, io);
      }
      published_ = true;
      buffer_.release();
    } catch (...) {
      abandon();
      throw;
    }
  }

  const std::string& key() const override { return key_; }

 private:
  void check_open(std::string_view op) const {
    if (committed_) throw UsageError(std::string(op) + " " + name_ + ": writer already committed");
    if (failed_) throw UsageError(std::string(op) + " " + name_ + ": an earlier append failed; start a new writer");
  }

  // The pool the next part is staged in: the given one while parts are its buffer size,
  // then one of this writer's own per grown size. Before a new size, the parts in flight
  // (whose leases point into the older pool) are waited for and the older pool freed, so a
  // writer holds one grown pool at a time (a pipeline drain at each of the <= 9 doublings).
  BufferPool& staging_pool() {
    if (part_bytes_ <= pool_->buffer_bytes()) return *pool_;
    if (!own_pool_ || own_pool_->buffer_bytes() < part_bytes_) {
      wait_all();
      own_pool_.reset();
      BufferPoolOptions options;
      options.buffer_bytes = part_bytes_;
      options.huge_pages = false;  // staged and sent, never mapped to a disk (s3_storage.cc)
      options.capacity_bytes = part_bytes_ * (own_in_flight() + 1);
      own_pool_ = std::make_unique<BufferPool>(options);
    }
    return *own_pool_;
  }

  // Grown parts in flight at once: about the bytes parts_in_flight parts of the first size
  // hold, at least one; none without overlap_fill.
  std::size_t own_in_flight() const {
    if (!limits_.overlap_fill) return 0;
    const std::size_t base_bytes = limits_.part_bytes * static_cast<std::size_t>(limits_.parts_in_flight);
    return std::max<std::size_t>(1, base_bytes / part_bytes_);
  }

  // Hands the full buffer to an upload task (starting the upload before the first part), or
  // without overlap_fill uploads it here. `last`: no bytes follow (commit); otherwise at
  // least one more part does.
  void send_part(const IoOptions& io, bool last) {
    if (limits_.max_parts > 0 && parts_ + (last ? 1 : 2) > limits_.max_parts) {
      throw StorageError(StorageError::Kind::kOther, "write " + name_ + ": the object needs more than " +
                                                         std::to_string(limits_.max_parts) +
                                                         " parts (the service's limit; parts have grown to " +
                                                         std::to_string(part_bytes_ >> 20) + " MiB)");
    }
    if (!started_) {
      upload_->start(io);
      started_ = true;
    }
    if (!limits_.overlap_fill) {
      upload_part_here(io);
      return;
    }
    const int max_in_flight =
        part_bytes_ > pool_->buffer_bytes() ? static_cast<int>(own_in_flight()) : limits_.parts_in_flight;
    while (static_cast<int>(inflight_.size()) >= max_in_flight) wait_oldest();
    const std::size_t index = parts_++;
    const std::uint64_t offset = position_ - fill_;
    const std::size_t size = fill_;
    // The task stops retrying when the caller stops or this writer is abandoned.
    IoOptions task_io = io;
    task_io.stop = stop_parts_.get_token();
    inflight_.push_back(
        std::async(std::launch::async, [upload = upload_, lease = std::move(buffer_), index, offset, size, task_io,
                                        caller = io.stop, stop_parts = stop_parts_]() mutable {
          // The buffer goes back to the pool when the part ends, failed or not, not when the
          // writer collects this future: the writer may be waiting on the pool for its next one.
          BufferPool::Lease buffer = std::move(lease);
          std::stop_callback link(caller, [&stop_parts] { stop_parts.request_stop(); });
          upload->put_part(index, offset, ByteSpan(buffer.data(), size), task_io);
        }));
    buffer_ = BufferPool::Lease();
    fill_ = 0;
    part_bytes_ = part_bytes_at(parts_, limits_.part_bytes, limits_.max_parts);
  }

  // Without overlap_fill: the part uploads on this thread (the caller's stop token stops its
  // retries) and the buffer stays leased to be refilled, unless the next part outgrows it.
  void upload_part_here(const IoOptions& io) {
    const std::size_t index = parts_++;
    upload_->put_part(index, position_ - fill_, ByteSpan(buffer_.data(), fill_), io);
    fill_ = 0;
    part_bytes_ = part_bytes_at(parts_, limits_.part_bytes, limits_.max_parts);
    if (part_bytes_ > buffer_.size()) buffer_.release();
  }

  void wait_oldest() {
    std::future<void> oldest = std::move(inflight_.front());
    inflight_.pop_front();
    oldest.get();  // rethrows the part's error
  }

  // Collects the parts that finished (rethrowing the first error), oldest first.
  void reap_finished() {
    while (!inflight_.empty() && inflight_.front().wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      wait_oldest();
    }
  }

  void wait_all() {
    while (!inflight_.empty()) wait_oldest();
  }

  // Stops and waits for the parts in flight, gives the buffer back and aborts the upload.
  void abandon() noexcept {
    stop_parts_.request_stop();
    while (!inflight_.empty()) {
      try {
        wait_oldest();
      } catch (...) {
        // The upload is being abandoned; the error that made us abandon it is reported.
      }
    }
    buffer_.release();
    if (!started_) return;
    started_ = false;
    try {
      upload_->abort();
    } catch (const std::exception& e) {
      // Destructors cannot report; what an abort leaves is never visible (S3's remove_prefix()
      // aborts unfinished uploads, GCS sessions and Azure blocks expire).
      std::cerr << "shardpoint: warning: " << e.what() << "\n";
    }
  }

  std::string key_;
  std::string name_;
  std::shared_ptr<PartUpload> upload_;
  std::shared_ptr<BufferPool> pool_;
  UploadLimits limits_;
  std::size_t part_bytes_ = 0;  // of the part being filled: part_bytes_at(parts_, ...)
  // The pool of grown parts (declared before buffer_: a lease must go before its pool).
  std::unique_ptr<BufferPool> own_pool_;
  BufferPool::Lease buffer_;
  std::size_t fill_ = 0;
  std::uint64_t position_ = 0;
  std::size_t parts_ = 0;
  std::deque<std::future<void>> inflight_;
  std::stop_source stop_parts_;  // requested when the writer is abandoned or the caller stops
  bool started_ = false;         // start() ran and the upload is not aborted
  bool committed_ = false;       // commit() was called
  bool published_ = false;       // commit() succeeded
  bool failed_ = false;          // an append() threw
};

}  // namespace

std::size_t part_bytes_at(std::size_t index, std::size_t part_bytes, std::size_t max_parts) {
  if (max_parts < 10) return part_bytes;
  const std::size_t doublings = std::min<std::size_t>(index / (max_parts / 10), 9);
  return part_bytes << doublings;
}

std::unique_ptr<StorageWriter> make_upload_writer(std::string key, std::string name, std::shared_ptr<PartUpload> upload,
                                                  std::shared_ptr<BufferPool> pool, UploadLimits limits) {
  return std::make_unique<UploadWriter>(std::move(key), std::move(name), std::move(upload), std::move(pool), limits);
}

}  // namespace shardpoint::storage::http
