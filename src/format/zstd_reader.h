// ZstdReader: the decompressed bytes of one "stream.zstd/1" item (docs/dcp-format.md §2.4),
// produced in order from its stored bytes with bounded buffers.
//
// PyTorch's ZStandard extension writes each item as one zstd frame (zstandard's
// stream_writer: no content size in the frame header), and its reader stops at the end of
// that first frame. This reader does the same and is stricter: the frame must end exactly
// at the end of the item's stored bytes (bytes after it are a FormatError), and stored
// bytes that end inside the frame are a FormatError. A zstd item has no index, so a reader
// that wants bytes at decompressed offset N decompresses from the start and skips N bytes
// (skip()).
//
// Memory: one input buffer of ZSTD_DStreamInSize() (128 KiB + a block header), the
// decompression context, and the frame's window (at most 2^27 bytes, libzstd's default
// limit; PyTorch's level-3 frames use 2 MiB). Output goes straight into the caller's buffer.
//
// Thread-safety: one thread at a time; the source must allow concurrent reads when other
// readers share it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "shardpoint/byte_stream.h"

namespace shardpoint::format {

class ZstdReader {
 public:
  // Decompresses the stored bytes [offset, offset + length) of `source`. `label` names the
  // item in errors ("__0_0.distcp: item \"w\" [909+663]"). Reads nothing yet.
  ZstdReader(std::shared_ptr<const ByteSource> source, std::uint64_t offset, std::uint64_t length, std::string label);
  ~ZstdReader();
  ZstdReader(const ZstdReader&) = delete;
  ZstdReader& operator=(const ZstdReader&) = delete;

  // Called with every run of stored bytes as it is read (its offset within the item's
  // stored bytes): checksums over the stored form. Set before the first read.
  void on_stored(std::function<void(std::uint64_t at, ByteSpan bytes)> observer) { observer_ = std::move(observer); }

  // Decompressed bytes produced so far.
  std::uint64_t position() const { return position_; }
  // True once the frame has ended (every byte produced).
  bool done() const { return done_; }

  // Up to out.size() next bytes into out; returns how many. 0 only when out is empty or the
  // frame has ended. Throws FormatError for corrupt or truncated data or bytes after the
  // frame ("<label>: ..."), StorageError when the source fails.
  std::size_t read_some(std::span<std::byte> out);
  // Exactly out.size() bytes. Throws FormatError "<label>: zstd frame ends after N bytes,
  // M needed" when the frame is shorter, and as read_some.
  void read_exact(std::span<std::byte> out);
  // Decompresses and drops n bytes. Throws as read_exact.
  void skip(std::uint64_t n);
  // Decompresses to the end of the frame, dropping the bytes; returns position().
  std::uint64_t drain();

 private:
  void refill();

  struct Context;
  std::shared_ptr<const ByteSource> source_;
  std::uint64_t offset_;
  std::uint64_t length_;
  std::string label_;
  std::unique_ptr<Context> ctx_;
  std::vector<std::byte> in_;
  std::size_t in_pos_ = 0;
  std::size_t in_size_ = 0;
  std::uint64_t consumed_ = 0;  // stored bytes read into in_ so far
  std::uint64_t position_ = 0;
  bool done_ = false;
  std::vector<std::byte> scratch_;  // skip()'s output, allocated on first use
  std::function<void(std::uint64_t, ByteSpan)> observer_;
};

}  // namespace shardpoint::format
