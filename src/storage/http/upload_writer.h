// The StorageWriter of every object-store driver (S3 multipart, GCS resumable, Azure block
// blobs): bytes are staged in BufferPool buffers, or borrowed from the caller
// (append_borrowed), and each full part is handed to an upload task; what differs between
// services is the PartUpload the driver supplies.
//
// Protocol (one writer):
//   1. append() copies bytes into a leased pool buffer; append_borrowed() (with
//      UploadLimits::borrow) records a span of at least kMinBorrowBytes as a piece of the
//      part instead, so a part is a list of pieces: the caller's spans and the writer's copies
//      of the bytes between them (zip headers, pickles), sent one after another
//      (Request::body_pieces). The digests UploadLimits asks for (SHA-256, CRC-32C, MD5) are
//      computed over the bytes as they are appended, while they are in the cache. A full part
//      with more bytes behind it becomes part i (part_bytes_at(i, ...) bytes: parts grow past
//      the first UploadLimits::max_parts / 10, see there; the grown ones are staged in buffers
//      of a pool of the writer's own). start() runs once before part 0, then
//      put_part(i, offset, body) on a thread of its own. At most UploadLimits::parts_in_flight
//      parts are in flight, each holding its buffer (when it has copies) until its request
//      ends (memory stays bounded by the pool); a part that failed fails the next append(),
//      not only commit(). With UploadLimits::overlap_fill off, put_part() runs on the
//      writer's thread instead, inside the append() (or commit()) that sends the part, and its
//      buffer is then refilled: no part is in flight between calls and the writer holds one
//      buffer.
//   2. commit() of an object that fits in one part is put_whole() (one request publishes
//      it). Otherwise the last part is sent (or handed to finish() when the service takes
//      it last, GCS), every part is waited for, then finish() publishes the object whole.
//   3. A writer destroyed without commit(), or whose commit() or an append() failed, stops
//      the retries of its parts in flight, waits for them (their buffers belong to the pool,
//      their borrowed pieces to the caller) and calls abort() when start() ran. Errors of
//      abort() are printed as a warning. A failed append() or commit() does this before it
//      throws, so no borrowed byte is read after a call of the writer threw.
//   After a failed append() the writer only accepts destruction (UsageError otherwise): a
//   part may be missing, so committing would publish a hole.
//
// Thread-safety: a writer is used by one thread (storage.h); put_part() is called from
// several threads at once (without overlap_fill: one at a time, from the writer's thread),
// the other PartUpload methods from the writer's thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer_pool.h"
#include "shardpoint/storage.h"

namespace shardpoint::storage::http {

// append_borrowed() copies spans shorter than this: a piece costs a span in the part's list
// and a turn of libcurl's read callback, and small tensors' bytes are cheap to copy.
inline constexpr std::size_t kMinBorrowBytes = std::size_t{4} << 10;

// The bytes of one request body as the writer hands them over: spans to send one after
// another (Request::body_pieces), valid until the PartUpload call returns, and the digests
// UploadLimits asked for, computed over exactly these bytes.
struct PartBody {
  std::vector<ByteSpan> pieces;
  std::uint64_t size = 0;
  std::string sha256_hex;               // lowercase hex, when UploadLimits::sha256
  std::optional<std::uint32_t> crc32c;  // when UploadLimits::crc32c
  // When UploadLimits::md5 (content_md5() in body_checksum.h makes it a header).
  std::optional<std::array<std::uint8_t, 16>> md5;

  // The body as one span. REQUIRES at most one piece (a writer without UploadLimits::borrow
  // gives one piece per body).
  ByteSpan contiguous() const;
};

// One object's upload in parts, in the service's protocol. Every method throws
// StorageError naming the object when the service refuses.
class PartUpload {
 public:
  virtual ~PartUpload() = default;

  // One request that publishes data as the whole object (objects of at most one part).
  virtual void put_whole(const PartBody& body, const IoOptions& io) = 0;
  // Called once, before the first put_part() (S3: create the multipart upload; GCS: open
  // the resumable session; Azure: nothing).
  virtual void start(const IoOptions& io) = 0;
  // Uploads part `index` (0-based): the object's bytes [offset, offset + body.size).
  // Called from several threads at once (see UploadLimits::parts_in_flight).
  virtual void put_part(std::size_t index, std::uint64_t offset, const PartBody& body, const IoOptions& io) = 0;
  // Publishes the object of `parts` parts and `size` bytes. `tail` is the last bytes when
  // UploadLimits::tail_in_finish (they follow part parts - 1), else empty.
  virtual void finish(std::size_t parts, std::uint64_t size, const PartBody& tail, const IoOptions& io) = 0;
  // Abandons a started upload so nothing is published (S3: abort the multipart upload; GCS:
  // cancel the session; Azure: nothing, uncommitted blocks expire). Bounded in time.
  virtual void abort() = 0;
};

struct UploadLimits {
  // Bytes of every part but the last: at most the pool's buffer size.
  std::size_t part_bytes = 0;
  // Parts uploading at once; 1 for services that take parts in order, then one part
  // uploads while the writer fills the next buffer. Ignored without overlap_fill.
  int parts_in_flight = 4;
  // Whether the writer fills its next buffer while parts upload. On: parts upload on
  // threads of their own and a writer holds up to parts_in_flight + 1 buffers. Off: the
  // append() that needs a full buffer emptied uploads it itself, on the caller's thread, and
  // then refills it: one buffer per writer, nothing in flight between calls, and that
  // append() blocks for the part's request (and throws its error).
  // Turn it off where one object takes one part at a time and several objects upload at
  // once (GCS sessions: a save writes 4 objects per rank): the other objects keep the
  // service busy, so the memory of a second buffer buys parts twice the size instead, which
  // cost the service fewer requests. The cost: a writer that uploads alone loses the
  // overlap of filling one part with uploading the one before.
  bool overlap_fill = true;
  // The last bytes go to finish() instead of put_part() (GCS: the last chunk names the total).
  bool tail_in_finish = false;
  // append_borrowed() keeps the caller's spans (of at least kMinBorrowBytes) as pieces of
  // the part instead of copying them. Off: every byte is copied and each body is one piece
  // (for PartUploads that need one span: GCS resumes a chunk part-way from its middle).
  bool borrow = true;
  // Digests of every body (PartBody), computed by the appending thread over each slice of
  // bytes it appends, while the slice is still in the cache from the caller's own pass over
  // it (the engine's zip CRC): a pass over the part in memory later costs more (SHA-256: 0.9
  // s of CPU per GB over 8 MiB parts against 0.6 s over hot 256 KiB slices, 2 shared cores
  // under load). The cost: hashing no longer spreads over the parts' threads; one SHA-256
  // thread with SHA-NI keeps up with about 1.5 GB/s. S3 over http signs each body's SHA-256.
  // Azure sends every body's MD5 (Content-MD5). MD5 has no instructions of its own: about
  // 0.74 GB/s on one thread here, so one writer's appends top out near that (object-store
  // saves write 4 files per rank in parallel).
  bool sha256 = false;
  bool crc32c = false;
  bool md5 = false;
  // The service's most parts per object (S3: 10,000; Azure: 50,000 blocks); 0 = no limit
  // (GCS sessions). Part sizes grow so that this is never exceeded (part_bytes_at).
  std::size_t max_parts = 0;
};

// The size of part `index` (0-based) of an upload whose first parts are `part_bytes`: with
// max_parts > 0, part_bytes doubles after every max_parts / 10 parts, at most 9 times. So
// objects up to max_parts / 10 parts stay in parts of part_bytes (the pool's buffers:
// 10,000 / 10 x 8 MiB = 7.8 GiB on S3), and max_parts parts hold up to
// part_bytes x max_parts / 10 x 1023 bytes (8 MiB parts on S3: 8 TiB, beyond S3's 5 TiB
// object limit) instead of part_bytes x max_parts (78 GiB). A doubling of a multiple of
// 256 KiB stays one (GCS's chunk rule). Pure; max_parts == 0 gives part_bytes.
std::size_t part_bytes_at(std::size_t index, std::size_t part_bytes, std::size_t max_parts);

// Options of a pool of upload buffers (parts, blocks, chunks) of buffer_bytes each, at
// most capacity_bytes together. No huge pages: the buffers are copied into and sent, never
// mapped to a disk, and their first touch (2 MiB zeroed per fault, with compaction under
// THP defrag=madvise) was 30 % of a rank's CPU in a 0.34 GB S3 save on 2 shared cores.
BufferPoolOptions upload_pool_options(std::size_t buffer_bytes, std::size_t capacity_bytes);

// A writer of `key` (named in messages as `name`, e.g. `S3 object "s3://b/p/key"`) that
// stages bytes in buffers of pool. REQUIRES: 0 < limits.part_bytes <= pool->buffer_bytes().
// Parts larger than the pool's buffers (part_bytes_at) are staged in a pool of the writer's
// own, sized so that the bytes in flight stay about parts_in_flight x part_bytes (at least
// one grown part in flight and one filling; without overlap_fill, one buffer); one such
// pool at a time (the parts in flight are waited for when the size doubles). An object that
// would need more than max_parts parts even so fails its append with StorageError kOther
// naming the part size.
std::unique_ptr<StorageWriter> make_upload_writer(std::string key, std::string name, std::shared_ptr<PartUpload> upload,
                                                  std::shared_ptr<BufferPool> pool, UploadLimits limits);

}  // namespace shardpoint::storage::http
