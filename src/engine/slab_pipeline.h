// SlabPipeline: copies the bytes of a sequence of tensors, each in row-major order, from a
// reader to a sequential writer through a fixed set of page-aligned buffers (the slab),
// so the memory used does not depend on the tensors' sizes.
//
// How: the tensors are cut into pieces, in output order, and the pieces packed into
// batches that each fit one buffer (every piece starts at a page boundary of its buffer,
// so the writer can hand whole pages to an O_DIRECT file without a staging copy). A
// "boxed" tensor is cut into BoxCursor boxes (engine/chunking.h: each a contiguous run of
// its bytes, read by box); any other is cut into byte ranges. `readers` threads each take
// a free buffer and the next batch and fill it, while the calling thread hands the filled
// buffers to the sink in batch order; so reads overlap each other and the writes.
//
// Errors: an exception thrown by a callback (or std::bad_alloc for the buffers) stops the
// readers, is rethrown by run() on the calling thread, and the sink sees no further
// pieces; the reader threads are joined before run() returns or throws.
//
// Thread-safety: read() and announce() are called from the reader threads, concurrently;
// begin(), write(), end() and after_buffer() from the thread calling run(), in order. One
// run() at a time per pipeline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "shardpoint/metadata.h"

namespace shardpoint::engine {

struct SlabPipelineOptions {
  // Buffers in the slab. More lets readers run further ahead of the writer.
  std::size_t buffers = 4;
  // Bytes of each buffer; REQUIRES a multiple of kSlabPage and > 0. The slab holds
  // buffers * buffer_bytes for the pipeline's lifetime.
  std::size_t buffer_bytes = 1 << 20;
  // Reader threads (REQUIRES >= 1). Each reader's read() may hold its own scratch memory.
  std::size_t readers = 2;
  // Tensors announced to announce() ahead of the last one in a claimed batch (cold
  // caches: lets the reader ask the kernel to read ahead).
  std::size_t read_ahead = 16;
};

// Alignment of the buffers and of every piece in them.
inline constexpr std::size_t kSlabPage = 4096;

// Tensor k of the sequence as the pipeline cuts it.
struct SlabTensor {
  format::Shape shape;
  std::size_t itemsize = 1;
  bool boxed = true;  // cut into boxes (read by box) rather than byte ranges
  std::uint64_t nbytes() const;
};

// A run of bytes of the output: [at, at + n) of tensor k (row-major), for a boxed tensor
// the box (offsets, sizes). `first` / `last`: tensor k starts / ends with this piece. A
// tensor without elements is one piece with n = 0 (first and last).
struct SlabPiece {
  std::size_t k = 0;
  format::Shape offsets;
  format::Shape sizes;
  std::uint64_t at = 0;
  std::uint64_t n = 0;
  std::size_t buffer_offset = 0;  // a multiple of kSlabPage
  bool first = false;
  bool last = false;
};

struct SlabCallbacks {
  // Fills dest (n bytes) with the piece. Reader threads. Required.
  std::function<void(const SlabPiece& piece, std::span<std::byte> dest)> read;
  // Tensors [from, to) will be read soon (best effort hint; may be empty). Reader threads.
  std::function<void(std::size_t from, std::size_t to)> announce;
  // Before the first piece of tensor k / after its last. Calling thread. May be empty.
  std::function<void(std::size_t k)> begin;
  std::function<void(std::size_t k)> end;
  // Each piece's bytes, in output order (not called for empty pieces). Calling thread.
  std::function<void(std::span<const std::byte> data)> write;
  // After each buffer has been written (progress reports, cancellation checks: an
  // exception thrown here stops the copy). Calling thread. May be empty.
  std::function<void()> after_buffer;
};

class SlabPipeline {
 public:
  // Allocates the slab. Throws std::bad_alloc.
  explicit SlabPipeline(const SlabPipelineOptions& options);
  ~SlabPipeline();
  SlabPipeline(const SlabPipeline&) = delete;
  SlabPipeline& operator=(const SlabPipeline&) = delete;

  // Streams every piece of tensors[0], tensors[1], ... through the callbacks (see the top
  // of this file). Blocks until all is written or an error stops it.
  void run(const std::vector<SlabTensor>& tensors, const SlabCallbacks& callbacks);

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };
  SlabPipelineOptions options_;
  std::unique_ptr<std::byte, FreeDeleter> slab_;  // options_.buffers page-aligned buffers
};

}  // namespace shardpoint::engine
