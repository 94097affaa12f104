// ZstdWriter: a ByteSink that compresses what it is given into one zstd frame written to
// another sink: how an item is stored with the "stream.zstd/1" transform
// (docs/dcp-format.md §2.4), as PyTorch's ZStandard extension stores it (one frame per
// item, no content size in the header, since the item streams out).
//
// The frame carries libzstd's content checksum (XXH64 of the decompressed bytes), which
// every zstd reader checks, PyTorch's included. position() counts the bytes given (the
// decompressed offset), which is what a torch.save writer over this sink needs.
//
// Memory: one compression context per thread, kept and reset between frames (level 3:
// about 1.3 MiB), and one output buffer of ZSTD_CStreamOutSize() (128 KiB).
//
// Thread-safety: one thread at a time per writer, and one unfinished writer per thread
// (they share the thread's context).
#pragma once

#include <cstdint>
#include <vector>

#include "shardpoint/byte_stream.h"

namespace shardpoint::format {

// PyTorch's ZStandard extension compresses at zstandard's default level, libzstd's 3.
inline constexpr int kZstdDefaultLevel = 3;

class ZstdWriter final : public ByteSink {
 public:
  // Starts a frame written to `target` at `level` (1..19; higher is smaller and slower).
  // `workers` > 0 compresses on that many extra threads (libzstd's nbWorkers; large
  // items only, split in jobs of a few MiB). Throws UsageError for a level out of range.
  ZstdWriter(ByteSink& target, int level = kZstdDefaultLevel, int workers = 0);
  ~ZstdWriter() override;
  ZstdWriter(const ZstdWriter&) = delete;
  ZstdWriter& operator=(const ZstdWriter&) = delete;

  void write(ByteSpan data) override;
  using ByteSink::write;
  // Bytes given so far (uncompressed).
  std::uint64_t position() const override { return consumed_; }
  // Ends the frame, writing its last bytes to the target. REQUIRES called once, last.
  void finish();

 private:
  void pump(ByteSpan data, bool end);

  ByteSink& target_;
  std::vector<std::byte> out_;
  std::uint64_t consumed_ = 0;
  bool finished_ = false;
};

}  // namespace shardpoint::format
