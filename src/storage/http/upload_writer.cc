#include "storage/http/upload_writer.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
#include <stop_token>

#include "core/checksum.h"
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
    if (limits_.sha256) sha_ = std::make_unique<Sha256>();
    if (limits_.md5) md5_ = std::make_unique<Md5>();
  }

  ~UploadWriter() override {
    if (!published_) abandon();
  }

  void append(ByteSpan data, const IoOptions& io) override { add(data, io, /*borrow=*/false); }
  void append_borrowed(ByteSpan data, const IoOptions& io) override { add(data, io, limits_.borrow); }

  std::uint64_t position() const override { return position_; }

  void commit(const IoOptions& io) override {
    check_open("commit");
    committed_ = true;  // single use, even when this commit fails
    try {
      if (io_expired(io)) check_io(io, "commit " + name_);
      if (!started_) {
        upload_->put_whole(take_body(), io);
      } else if (limits_.tail_in_finish) {
        wait_all();
        upload_->finish(parts_, position_, take_body(), io);
      } else {
        if (part_.size > 0) send_part(io, /*last=*/true);
        wait_all();
        upload_->finish(parts_, position_, PartBody{}, io);
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

  // append() and append_borrowed(): bytes go into the part being filled, a piece borrowed
  // or copied, digested on the way; a full part with more bytes behind it is sent.
  void add(ByteSpan data, const IoOptions& io, bool borrow) {
    check_open("append");
    if (io_expired(io)) check_io(io, "write " + name_);
    // A span is borrowed whole or not at all: the end of a large one that fills a part's
    // last bytes is still the caller's.
    const bool keep = borrow && data.size() >= kMinBorrowBytes;
    try {
      while (!data.empty()) {
        // A full part waits for more bytes: an object of exactly one part stays one request.
        if (part_.size == part_bytes_) send_part(io, /*last=*/false);
        if (part_.size == 0) reap_finished();  // a failed part fails the writer now, not at commit
        const std::size_t n = std::min<std::size_t>(data.size(), part_bytes_ - part_.size);
        ByteSpan chunk = data.first(n);
        if (keep) {
          add_piece(chunk);
        } else {
          chunk = copy_in(chunk, io);
        }
        if (sha_) sha_->update(chunk);
        if (limits_.crc32c) crc_ = crc32c(crc_, chunk);
        if (md5_) md5_->update(chunk);
        part_.size += n;
        position_ += n;
        data = data.subspan(n);
      }
    } catch (...) {
      failed_ = true;
      abandon();  // nothing borrowed is read once a call has thrown
      throw;
    }
  }

  // Copies chunk behind the part's earlier copies (leasing a buffer at the part's first);
  // returns the copy.
  ByteSpan copy_in(ByteSpan chunk, const IoOptions& io) {
    if (!buffer_) {
      buffer_ = staging_pool().acquire(io.deadline, io.stop);
      copied_ = 0;
    }
    std::byte* at = buffer_.data() + copied_;
    std::memcpy(at, chunk.data(), chunk.size());
    copied_ += chunk.size();
    add_piece(ByteSpan(at, chunk.size()));
    return ByteSpan(at, chunk.size());
  }

  // Appends a piece to the part, joined to the last one when it continues it in memory
  // (a tensor's slices, copies one after another).
  void add_piece(ByteSpan piece) {
    if (!part_.pieces.empty()) {
      ByteSpan& last = part_.pieces.back();
      if (last.data() + last.size() == piece.data()) {
        last = ByteSpan(last.data(), last.size() + piece.size());
        return;
      }
    }
    part_.pieces.push_back(piece);
  }

  // The part filled so far with its digests; the next part starts empty. Its copies stay in
  // buffer_ (the caller moves the lease along with the body).
  PartBody take_body() {
    PartBody body = std::move(part_);
    part_ = PartBody{};
    if (sha_) {
      body.sha256_hex = sha_->hex_digest();
      sha_ = std::make_unique<Sha256>();
    }
    if (limits_.crc32c) body.crc32c = crc_;
    if (md5_) {
      body.md5 = md5_->digest();
      md5_ = std::make_unique<Md5>();
    }
    crc_ = 0;
    copied_ = 0;
    return body;
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
      own_pool_ = std::make_unique<BufferPool>(upload_pool_options(part_bytes_, part_bytes_ * (own_in_flight() + 1)));
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

  // Hands the full part to an upload task (starting the upload before the first part), or
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
    const std::uint64_t offset = position_ - part_.size;
    // The task stops retrying when the caller stops or this writer is abandoned.
    IoOptions task_io = io;
    task_io.stop = stop_parts_.get_token();
    inflight_.push_back(
        std::async(std::launch::async, [upload = upload_, lease = std::move(buffer_), body = take_body(), index, offset,
                                        task_io, caller = io.stop, stop_parts = stop_parts_]() mutable {
          // The buffer goes back to the pool when the part ends, failed or not, not when the
          // writer collects this future: the writer may be waiting on the pool for its next one.
          BufferPool::Lease buffer = std::move(lease);
          std::stop_callback link(caller, [&stop_parts] { stop_parts.request_stop(); });
          upload->put_part(index, offset, body, task_io);
        }));
    buffer_ = BufferPool::Lease();
    part_bytes_ = part_bytes_at(parts_, limits_.part_bytes, limits_.max_parts);
  }

  // Without overlap_fill: the part uploads on this thread (the caller's stop token stops its
  // retries) and the buffer stays leased to be refilled, unless the next part outgrows it.
  void upload_part_here(const IoOptions& io) {
    const std::size_t index = parts_++;
    const std::uint64_t offset = position_ - part_.size;
    upload_->put_part(index, offset, take_body(), io);
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
    part_ = PartBody{};
    copied_ = 0;
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
  BufferPool::Lease buffer_;     // the copies of the part being filled (leased at its first)
  std::size_t copied_ = 0;       // bytes of buffer_ in use
  PartBody part_;                // the part being filled: its pieces and size
  std::unique_ptr<Sha256> sha_;  // of the part being filled, when limits_.sha256
  std::unique_ptr<Md5> md5_;     // of the part being filled, when limits_.md5
  std::uint32_t crc_ = 0;        // CRC-32C of the part being filled, when limits_.crc32c
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

ByteSpan PartBody::contiguous() const {
  if (pieces.size() > 1) throw Error("PartBody::contiguous: a body of " + std::to_string(pieces.size()) + " pieces");
  return pieces.empty() ? ByteSpan() : pieces.front();
}

BufferPoolOptions upload_pool_options(std::size_t buffer_bytes, std::size_t capacity_bytes) {
  BufferPoolOptions options;
  options.buffer_bytes = buffer_bytes;
  options.capacity_bytes = capacity_bytes;
  options.huge_pages = false;
  return options;
}

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
