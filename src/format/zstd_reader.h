// ZstdReader: the decompressed bytes of one "stream.zstd/1" item (docs/dcp-format.md §2.4),
// produced in order from its stored bytes with bounded buffers.
//
// PyTorch's ZStandard extension writes each item as one zstd frame (zstandard's
// stream_writer: no content size in the frame header), and its reader stops at the end of
// that first frame. This reader does the same and is stricter: the frame must end exactly
// at the end of the item's stored bytes (bytes after it are a FormatError), stored bytes
// that end inside the frame are a FormatError, and so are skippable frames and windows over
// 2^27 bytes (libzstd's default limit). A zstd item has no index, so a reader that wants
// bytes at decompressed offset N decompresses from the start and skips N bytes (skip()).
//
// Decompression goes block by block (libzstd's buffer-less API). A block lands in the
// window buffer, from which it is copied out, or, for read_into(..., in_place), straight in
// the caller's buffer when that buffer is long enough to hold the frame's window: then no
// byte is copied, and the caller's buffer is the window later blocks copy matches from.
//
// Memory: one input buffer of kInputBytes (1 MiB), the window buffer (the frame's window plus
// two blocks: 2.3 MiB for PyTorch's level-3 frames, at most 2^27 + 256 KiB) and the
// decompression context. Both buffers and the context are kept for the next reader of the
// same thread (up to two sets per thread, windows up to 16 MiB), so small items allocate
// nothing.
//
// Thread-safety: one thread at a time; the source must allow concurrent reads when other
// readers share it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "shardpoint/byte_stream.h"

namespace shardpoint::format {

struct ZstdWorkspace;

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
  // Bytes decompressed straight into read_into's buffers (the rest were copied out of the
  // window buffer).
  std::uint64_t in_place_bytes() const { return in_place_; }
  // True once the frame has ended and every byte of it has been produced.
  bool done() const { return frame_ended_ && ring_out_ == ring_pos_; }

  // Up to out.size() next bytes into out; returns how many. 0 only when out is empty or the
  // frame has ended. Throws FormatError for corrupt or truncated data or bytes after the
  // frame ("<label>: ..."), StorageError when the source fails.
  std::size_t read_some(std::span<std::byte> out);
  // Fills out, stopping early only where the frame ends; returns how many bytes it wrote.
  // `produced` (may be empty) sees each written run of out in order, right after it is
  // written (a checksum while the bytes are in cache). With `in_place`, whole blocks are
  // decompressed straight into out where it has room for the frame's window and a block
  // (else they go through the window buffer): REQUIRES then that out stays alive and
  // unchanged until this reader is destroyed (later blocks copy matches from it), and the
  // bytes of out past the returned count are unspecified. Throws as read_some.
  std::size_t read_into(std::span<std::byte> out, const std::function<void(ByteSpan)>& produced = {},
                        bool in_place = false);
  // Exactly out.size() bytes. Throws FormatError "<label>: zstd frame ends after N bytes,
  // M needed" when the frame is shorter, and as read_some.
  void read_exact(std::span<std::byte> out);
  // Decompresses and drops n bytes (no copy). Throws as read_exact.
  void skip(std::uint64_t n);
  // Decompresses to the end of the frame, dropping the bytes; returns position().
  std::uint64_t drain();

  // Stored bytes read per refill: large reads, each checksummed (on_stored) while in cache.
  static constexpr std::size_t kInputBytes = std::size_t{1} << 20;

 private:
  // Reads the frame header, sizes the window buffer and starts the context.
  void start();
  // Makes `need` stored bytes available at in_pos_. Throws FormatError when the item's
  // stored bytes end first.
  void ensure_input(std::size_t need);
  // Passes the frame's headers and checksum until the next block; sets frame_ended_ (and
  // checks nothing follows the frame) when there is none.
  void to_next_block();
  // Decompresses the next block into [dst, dst + capacity); returns its size.
  std::size_t decode_block(std::byte* dst, std::size_t capacity);
  // Decompresses the next block into the window buffer. REQUIRES no pending bytes there.
  void block_to_window();
  // Copies pending window-buffer bytes into out; returns how many.
  std::size_t take_pending(std::span<std::byte> out);
  [[noreturn]] void throw_corrupt(std::size_t ret) const;
  [[noreturn]] void throw_truncated() const;

  struct WorkspaceRelease {
    void operator()(ZstdWorkspace* w) const;
  };
  std::shared_ptr<const ByteSource> source_;
  std::uint64_t offset_;
  std::uint64_t length_;
  std::string label_;
  std::unique_ptr<ZstdWorkspace, WorkspaceRelease> ws_;
  std::function<void(std::uint64_t, ByteSpan)> observer_;
  // Stored bytes: in the input buffer [in_pos_, in_size_); consumed_ read from the source.
  std::size_t in_pos_ = 0;
  std::size_t in_size_ = 0;
  std::uint64_t consumed_ = 0;
  // The frame's parameters (from its header).
  bool started_ = false;
  bool frame_ended_ = false;
  std::uint64_t window_ = 0;
  std::size_t block_max_ = 0;
  std::uint64_t content_size_ = 0;  // ZSTD_CONTENTSIZE_UNKNOWN when the header has none
  std::size_t ring_size_ = 0;
  // The window buffer holds pending bytes [ring_out_, ring_pos_); the current segment (the
  // run of memory libzstd's window continues in) began at decompressed offset segment_at_,
  // in the window buffer or, when direct_end_ is set, in a caller's buffer ending there.
  std::size_t ring_out_ = 0;
  std::size_t ring_pos_ = 0;
  std::uint64_t segment_at_ = 0;
  std::byte* direct_end_ = nullptr;
  std::uint64_t decoded_ = 0;   // bytes decompressed (position_ + pending)
  std::uint64_t position_ = 0;  // bytes handed out or skipped
  std::uint64_t in_place_ = 0;
};

}  // namespace shardpoint::format
