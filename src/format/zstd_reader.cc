// How the window is kept: libzstd's buffer-less decoder copies a block's matches from the
// bytes before it, which it finds in two runs of memory: the run it is writing into (the
// segment) and the one written before it. Each block goes either to the window buffer
// (restarted at its front when a block may no longer fit, as libzstd's own streaming
// decoder does) or into the caller's buffer. A new segment may start only where the current
// one holds the whole window (or everything since the frame began), and a caller's buffer
// starts one only where it will hold a whole window before it ends: then no match ever
// reaches past the two runs libzstd knows of.
#define ZSTD_STATIC_LINKING_ONLY
#include "format/zstd_reader.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "shardpoint/error.h"

namespace shardpoint::format {

// A decompression context and its buffers, reused by the readers of one thread.
struct ZstdWorkspace {
  ZSTD_DCtx* dctx = nullptr;
  std::unique_ptr<std::byte[]> input;
  std::unique_ptr<std::byte[]> ring;
  std::size_t ring_capacity = 0;
  ~ZstdWorkspace() { ZSTD_freeDCtx(dctx); }
};

namespace {

// The largest window accepted: libzstd's default limit for decoders (ZSTD_d_windowLogMax).
constexpr std::uint64_t kMaxWindow = std::uint64_t{1} << 27;
// Workspaces a thread keeps for its next readers: nested readers (a second pass while a first
// is open) find one each.
constexpr std::size_t kPooledWorkspaces = 2;
// The largest window buffer kept: 16 MiB covers level-19 frames (8 MiB windows); larger
// ones are freed with their reader.
constexpr std::size_t kPooledRingBytes = std::size_t{16} << 20;

std::vector<std::unique_ptr<ZstdWorkspace>>& pool() {
  thread_local std::vector<std::unique_ptr<ZstdWorkspace>> workspaces;
  return workspaces;
}

std::unique_ptr<ZstdWorkspace> acquire_workspace() {
  std::vector<std::unique_ptr<ZstdWorkspace>>& free = pool();
  if (!free.empty()) {
    std::unique_ptr<ZstdWorkspace> w = std::move(free.back());
    free.pop_back();
    return w;
  }
  auto w = std::make_unique<ZstdWorkspace>();
  w->dctx = ZSTD_createDCtx();
  if (w->dctx == nullptr) throw std::bad_alloc();
  w->input = std::make_unique_for_overwrite<std::byte[]>(ZstdReader::kInputBytes);
  return w;
}

bool is_block(ZSTD_nextInputType_e type) { return type == ZSTDnit_block || type == ZSTDnit_lastBlock; }

}  // namespace

void ZstdReader::WorkspaceRelease::operator()(ZstdWorkspace* w) const {
  std::unique_ptr<ZstdWorkspace> owned(w);
  std::vector<std::unique_ptr<ZstdWorkspace>>& free = pool();
  if (free.size() >= kPooledWorkspaces) return;
  if (owned->ring_capacity > kPooledRingBytes) {
    owned->ring.reset();
    owned->ring_capacity = 0;
  }
  free.push_back(std::move(owned));
}

ZstdReader::ZstdReader(std::shared_ptr<const ByteSource> source, std::uint64_t offset, std::uint64_t length,
                       std::string label)
    : source_(std::move(source)), offset_(offset), length_(length), label_(std::move(label)) {}

ZstdReader::~ZstdReader() = default;

void ZstdReader::throw_corrupt(std::size_t ret) const {
  throw FormatError(label_ + ": corrupt zstd data (stored bytes up to " + std::to_string(consumed_) +
                    "): " + ZSTD_getErrorName(ret));
}

void ZstdReader::throw_truncated() const {
  throw FormatError(label_ + ": zstd frame is truncated: the item's " + std::to_string(length_) +
                    " stored bytes end inside it (after " + std::to_string(decoded_) + " decompressed bytes)");
}

void ZstdReader::ensure_input(std::size_t need) {
  const std::size_t avail = in_size_ - in_pos_;
  if (avail >= need) return;
  const std::uint64_t left = length_ - consumed_;
  if (avail + left < need) throw_truncated();
  if (need > kInputBytes) {
    throw FormatError(label_ + ": corrupt zstd data (stored bytes up to " + std::to_string(consumed_) +
                      "): a block of " + std::to_string(need) + " stored bytes, more than a zstd block can hold");
  }
  std::byte* in = ws_->input.get();
  if (avail != 0) std::memmove(in, in + in_pos_, avail);
  in_pos_ = 0;
  in_size_ = avail;
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kInputBytes - avail, left));
  const std::span<std::byte> buf(in + avail, n);
  source_->read(offset_ + consumed_, buf, label_);
  if (observer_) observer_(consumed_, buf);
  consumed_ += n;
  in_size_ += n;
}

void ZstdReader::start() {
  started_ = true;
  ws_.reset(acquire_workspace().release());
  if (length_ == 0) throw_truncated();
  const std::size_t head = static_cast<std::size_t>(std::min<std::uint64_t>(ZSTD_FRAMEHEADERSIZE_MAX, length_));
  ensure_input(head);
  ZSTD_frameHeader header;
  const std::size_t ret = ZSTD_getFrameHeader(&header, ws_->input.get() + in_pos_, head);
  if (ZSTD_isError(ret)) throw_corrupt(ret);
  if (ret != 0) throw_truncated();
  if (header.frameType == ZSTD_skippableFrame) {
    throw FormatError(label_ + ": expected a zstd frame, found a skippable frame");
  }
  if (header.windowSize > kMaxWindow) {
    throw FormatError(label_ + ": zstd frame has a window of " + std::to_string(header.windowSize) +
                      " bytes, more than the " + std::to_string(kMaxWindow) + " this reader allows");
  }
  const std::size_t ring = ZSTD_decodingBufferSize_min(header.windowSize, header.frameContentSize);
  if (ZSTD_isError(ring)) throw_corrupt(ring);
  window_ = header.windowSize;
  block_max_ = header.blockSizeMax;
  content_size_ = header.frameContentSize;
  ring_size_ = ring;
  if (ws_->ring_capacity < std::max<std::size_t>(ring_size_, 1)) {
    ws_->ring.reset();
    ws_->ring_capacity = 0;
    ws_->ring = std::make_unique_for_overwrite<std::byte[]>(std::max<std::size_t>(ring_size_, 1));
    ws_->ring_capacity = std::max<std::size_t>(ring_size_, 1);
  }
  const std::size_t begun = ZSTD_decompressBegin(ws_->dctx);
  if (ZSTD_isError(begun)) throw_corrupt(begun);
  to_next_block();
}

void ZstdReader::to_next_block() {
  while (true) {
    const std::size_t need = ZSTD_nextSrcSizeToDecompress(ws_->dctx);
    if (need == 0) {
      frame_ended_ = true;
      const std::uint64_t after = (in_size_ - in_pos_) + (length_ - consumed_);
      if (after != 0) {
        throw FormatError(label_ + ": expected the item to end with its zstd frame, found " + std::to_string(after) +
                          " more stored bytes after it");
      }
      return;
    }
    if (is_block(ZSTD_nextInputType(ws_->dctx))) return;
    ensure_input(need);
    // No output: libzstd takes a non-empty output here as the start of a new segment.
    const std::size_t ret = ZSTD_decompressContinue(ws_->dctx, nullptr, 0, ws_->input.get() + in_pos_, need);
    if (ZSTD_isError(ret)) throw_corrupt(ret);
    in_pos_ += need;
  }
}

std::size_t ZstdReader::decode_block(std::byte* dst, std::size_t capacity) {
  const std::size_t need = ZSTD_nextSrcSizeToDecompress(ws_->dctx);
  ensure_input(need);
  const std::size_t ret = ZSTD_decompressContinue(ws_->dctx, dst, capacity, ws_->input.get() + in_pos_, need);
  if (ZSTD_isError(ret)) throw_corrupt(ret);
  in_pos_ += need;
  decoded_ += ret;
  return ret;
}

void ZstdReader::block_to_window() {
  if (direct_end_ != nullptr) {
    // Back from a caller's buffer, which holds a whole window (or the whole frame so far).
    direct_end_ = nullptr;
    ring_pos_ = ring_out_ = 0;
    segment_at_ = decoded_;
  } else if (ring_size_ < content_size_ && ring_pos_ + block_max_ > ring_size_) {
    // No room for a whole block: start again at the front, after the window's worth behind.
    ring_pos_ = ring_out_ = 0;
    segment_at_ = decoded_;
  }
  const std::size_t n = decode_block(ws_->ring.get() + ring_pos_, ring_size_ - ring_pos_);
  ring_pos_ += n;
  to_next_block();
}

std::size_t ZstdReader::take_pending(std::span<std::byte> out) {
  const std::size_t n = std::min(out.size(), ring_pos_ - ring_out_);
  if (n != 0) std::memcpy(out.data(), ws_->ring.get() + ring_out_, n);
  ring_out_ += n;
  position_ += n;
  return n;
}

std::size_t ZstdReader::read_some(std::span<std::byte> out) {
  if (out.empty()) return 0;
  if (!started_) start();
  while (ring_out_ == ring_pos_) {
    if (frame_ended_) return 0;
    block_to_window();
  }
  return take_pending(out);
}

std::size_t ZstdReader::read_into(std::span<std::byte> out, const std::function<void(ByteSpan)>& produced,
                                  bool in_place) {
  if (out.empty()) return 0;
  if (!started_) start();
  std::size_t done = 0;
  auto wrote = [&](std::size_t n) {
    if (n != 0 && produced) produced(ByteSpan(out.data() + done, n));
    done += n;
  };
  wrote(take_pending(out));
  while (done < out.size() && !frame_ended_) {
    std::byte* const dst = out.data() + done;
    const std::size_t rest = out.size() - done;
    bool direct = false;
    if (in_place && rest >= block_max_) {
      // Continuing a run of this buffer, or starting one: the current segment must hold the
      // window, and the new one must come to hold it before it ends.
      const bool whole_history = segment_at_ == 0 || decoded_ - segment_at_ >= window_;
      direct = direct_end_ == dst || (whole_history && (decoded_ == 0 || rest >= window_ + block_max_));
    }
    if (!direct) {
      block_to_window();
      wrote(take_pending(out.subspan(done)));
      continue;
    }
    if (direct_end_ != dst) segment_at_ = decoded_;
    const std::size_t n = decode_block(dst, rest);
    direct_end_ = dst + n;
    position_ += n;
    in_place_ += n;
    wrote(n);
    to_next_block();
  }
  return done;
}

void ZstdReader::read_exact(std::span<std::byte> out) {
  const std::size_t n = read_into(out);
  if (n != out.size()) {
    throw FormatError(label_ + ": zstd frame ends after " + std::to_string(position_) + " bytes, " +
                      std::to_string(position_ + out.size() - n) + " needed");
  }
}

void ZstdReader::skip(std::uint64_t n) {
  if (n == 0) return;
  if (!started_) start();
  while (n > 0) {
    if (ring_out_ == ring_pos_) {
      if (frame_ended_) {
        throw FormatError(label_ + ": zstd frame ends after " + std::to_string(position_) + " bytes, " +
                          std::to_string(position_ + n) + " needed");
      }
      block_to_window();
      continue;
    }
    const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, ring_pos_ - ring_out_));
    ring_out_ += k;
    position_ += k;
    n -= k;
  }
}

std::uint64_t ZstdReader::drain() {
  if (!started_) start();
  while (true) {
    position_ += ring_pos_ - ring_out_;
    ring_out_ = ring_pos_;
    if (frame_ended_) return position_;
    block_to_window();
  }
}

}  // namespace shardpoint::format
