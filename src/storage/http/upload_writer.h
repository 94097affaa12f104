// The StorageWriter of every object-store driver (S3 multipart, GCS resumable, Azure block
// blobs): bytes are staged in BufferPool buffers and each full buffer is handed to an upload
// task; what differs between services is the PartUpload the driver supplies.
//
// Protocol (one writer):
//   1. append() copies bytes into a leased pool buffer. A full buffer with more bytes behind
//      it becomes part i: start() runs once before part 0, then put_part(i, offset, bytes)
//      on a thread of its own. At most UploadLimits::parts_in_flight parts are in flight,
//      each holding its buffer until its request ends (memory stays bounded by the pool);
//      a part that failed fails the next append(), not only commit().
//   2. commit() of an object that fits in one buffer is put_whole() (one request publishes
//      it). Otherwise the last part is sent (or handed to finish() when the service takes
//      it last, GCS), every part is waited for, then finish() publishes the object whole.
//   3. A writer destroyed without commit(), or whose commit() or an append() failed, stops
//      the retries of its parts in flight, waits for them (their buffers belong to the pool)
//      and calls abort() when start() ran. Errors of abort() are printed as a warning.
//   After a failed append() the writer only accepts destruction (UsageError otherwise): a
//   part may be missing, so committing would publish a hole.
//
// Thread-safety: a writer is used by one thread (storage.h); put_part() is called from
// several threads at once, the other PartUpload methods from the writer's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/buffer_pool.h"
#include "shardpoint/storage.h"

namespace shardpoint::storage::http {

// One object's upload in parts, in the service's protocol. Every method throws
// StorageError naming the object when the service refuses.
class PartUpload {
 public:
  virtual ~PartUpload() = default;

  // One request that publishes data as the whole object (objects of at most one part).
  virtual void put_whole(ByteSpan data, const IoOptions& io) = 0;
  // Called once, before the first put_part() (S3: create the multipart upload; GCS: open
  // the resumable session; Azure: nothing).
  virtual void start(const IoOptions& io) = 0;
  // Uploads part `index` (0-based): the object's bytes [offset, offset + data.size()).
  // Called from several threads at once (see UploadLimits::parts_in_flight).
  virtual void put_part(std::size_t index, std::uint64_t offset, ByteSpan data, const IoOptions& io) = 0;
  // Publishes the object of `parts` parts and `size` bytes. `tail` is the last bytes when
  // UploadLimits::tail_in_finish (they follow part parts - 1), else empty.
  virtual void finish(std::size_t parts, std::uint64_t size, ByteSpan tail, const IoOptions& io) = 0;
  // Abandons a started upload so nothing is published (S3: abort the multipart upload; GCS:
  // cancel the session; Azure: nothing, uncommitted blocks expire). Bounded in time.
  virtual void abort() = 0;
};

struct UploadLimits {
  // Bytes of every part but the last: at most the pool's buffer size.
  std::size_t part_bytes = 0;
  // Parts uploading at once; 1 for services that take parts in order (GCS sessions), then
  // one part uploads while the writer fills the next buffer.
  int parts_in_flight = 4;
  // The last bytes go to finish() instead of put_part() (GCS: the last chunk names the total).
  bool tail_in_finish = false;
};

// A writer of `key` (named in messages as `name`, e.g. `S3 object "s3://b/p/key"`) that
// stages bytes in buffers of pool. REQUIRES: 0 < limits.part_bytes <= pool->buffer_bytes().
std::unique_ptr<StorageWriter> make_upload_writer(std::string key, std::string name,
                                                  std::shared_ptr<PartUpload> upload,
                                                  std::shared_ptr<BufferPool> pool, UploadLimits limits);

}  // namespace shardpoint::storage::http
