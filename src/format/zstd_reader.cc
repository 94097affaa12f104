#include "format/zstd_reader.h"

#include <zstd.h>

#include <algorithm>
#include <new>

#include "shardpoint/error.h"

namespace shardpoint::format {

struct ZstdReader::Context {
  ZSTD_DCtx* dctx = nullptr;
  ~Context() { ZSTD_freeDCtx(dctx); }
};

ZstdReader::ZstdReader(std::shared_ptr<const ByteSource> source, std::uint64_t offset, std::uint64_t length,
                       std::string label)
    : source_(std::move(source)),
      offset_(offset),
      length_(length),
      label_(std::move(label)),
      ctx_(std::make_unique<Context>()) {
  ctx_->dctx = ZSTD_createDCtx();
  if (ctx_->dctx == nullptr) throw std::bad_alloc();
  in_.resize(ZSTD_DStreamInSize());
}

ZstdReader::~ZstdReader() = default;

void ZstdReader::refill() {
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(in_.size(), length_ - consumed_));
  const std::span<std::byte> buf(in_.data(), n);
  source_->read(offset_ + consumed_, buf, label_);
  if (observer_) observer_(consumed_, buf);
  consumed_ += n;
  in_pos_ = 0;
  in_size_ = n;
}

std::size_t ZstdReader::read_some(std::span<std::byte> out) {
  if (done_ || out.empty()) return 0;
  ZSTD_outBuffer output{out.data(), out.size(), 0};
  while (output.pos == 0) {
    if (in_pos_ == in_size_ && consumed_ < length_) refill();
    ZSTD_inBuffer input{in_.data(), in_size_, in_pos_};
    const std::size_t ret = ZSTD_decompressStream(ctx_->dctx, &output, &input);
    const bool progressed = input.pos != in_pos_ || output.pos != 0;
    in_pos_ = input.pos;
    if (ZSTD_isError(ret)) {
      throw FormatError(label_ + ": corrupt zstd data (stored bytes up to " + std::to_string(consumed_) +
                        "): " + ZSTD_getErrorName(ret));
    }
    if (ret == 0) {
      // The frame ended and every byte of it is in output.
      done_ = true;
      const std::uint64_t after = (in_size_ - in_pos_) + (length_ - consumed_);
      if (after != 0) {
        throw FormatError(label_ + ": expected the item to end with its zstd frame, found " + std::to_string(after) +
                          " more stored bytes after it");
      }
      break;
    }
    if (!progressed && in_pos_ == in_size_ && consumed_ == length_) {
      throw FormatError(label_ + ": zstd frame is truncated: the item's " + std::to_string(length_) +
                        " stored bytes end inside it (after " + std::to_string(position_ + output.pos) +
                        " decompressed bytes)");
    }
  }
  position_ += output.pos;
  return output.pos;
}

void ZstdReader::read_exact(std::span<std::byte> out) {
  while (!out.empty()) {
    const std::size_t n = read_some(out);
    if (n == 0) {
      throw FormatError(label_ + ": zstd frame ends after " + std::to_string(position_) + " bytes, " +
                        std::to_string(position_ + out.size()) + " needed");
    }
    out = out.subspan(n);
  }
}

void ZstdReader::skip(std::uint64_t n) {
  if (n == 0) return;
  if (scratch_.empty()) scratch_.resize(ZSTD_DStreamOutSize());
  while (n > 0) {
    const std::size_t step = static_cast<std::size_t>(std::min<std::uint64_t>(n, scratch_.size()));
    read_exact(std::span<std::byte>(scratch_.data(), step));
    n -= step;
  }
}

std::uint64_t ZstdReader::drain() {
  if (scratch_.empty()) scratch_.resize(ZSTD_DStreamOutSize());
  while (read_some(scratch_) != 0) {
  }
  return position_;
}

}  // namespace shardpoint::format
