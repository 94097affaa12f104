// How a zstd item is decompressed within bounded memory: the first pass fills one buffer up
// to keep_whole_bytes; an item that ends there is held whole. A longer one keeps the first
// kHeadBytes (zip local headers and data.pkl, which torch.save writes before the tensor
// data) and a sliding tail of kTailBytes to 2 * kTailBytes (the records after the data and
// the central directory); every byte between is CRC-32'd and dropped. A wanted range
// (DecompressOptions::deliver) is decompressed straight into its buffer but for its last
// kTailReserve bytes, CRC-32'd as it lands; the tail then restarts after it.
#include "engine/compressed_item.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/checksum.h"
#include "format/zstd_reader.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

// What a tensor item's records before its data take: ~600 bytes in what torch.save writes.
constexpr std::uint64_t kHeadBytes = std::uint64_t{64} << 10;
// What its records after the data and its central directory take: ~1 KiB in torch.save's.
constexpr std::uint64_t kTailBytes = std::uint64_t{1} << 20;
// What the zip parser reads back from the end of a blob: the end record and the largest
// comment (64 KiB + 22 bytes), with room. The last bytes of a wanted range go through the
// tail so that the tail holds them.
constexpr std::uint64_t kTailReserve = std::uint64_t{128} << 10;
// Output per decompression call: libzstd's block size, its recommended output step.
constexpr std::size_t kStepBytes = std::size_t{128} << 10;
// The tail buffer grows to this many times kTailBytes before its front is dropped: the
// bytes kept move once per (kTailSlack - 1) * kTailBytes decompressed.
constexpr std::uint64_t kTailSlack = 4;

class HeldImage final : public ByteSource {
 public:
  HeldImage(std::vector<std::byte> bytes, std::string name) : bytes_(std::move(bytes)), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return bytes_.size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    if (!out.empty()) std::memcpy(out.data(), bytes_.data() + offset, out.size());
  }
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override {
    check_range(offset, length, what);
    return ByteSpan(bytes_).subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
  }

 private:
  std::vector<std::byte> bytes_;
  std::string name_;
};

// The head [0, head.size()) and the tail [tail_at, size) of an image; reads elsewhere throw.
class SparseImage final : public ByteSource {
 public:
  SparseImage(std::vector<std::byte> head, std::vector<std::byte> tail, std::uint64_t tail_at, std::string name)
      : head_(std::move(head)), tail_(std::move(tail)), tail_at_(tail_at), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return tail_at_ + tail_.size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    std::uint64_t at = offset;
    std::size_t done = 0;
    while (done < out.size()) {
      const std::size_t left = out.size() - done;
      if (at < head_.size()) {
        const std::size_t n = std::min<std::size_t>(left, static_cast<std::size_t>(head_.size() - at));
        std::memcpy(out.data() + done, head_.data() + at, n);
        done += n;
        at += n;
      } else if (at >= tail_at_) {
        std::memcpy(out.data() + done, tail_.data() + (at - tail_at_), left);
        done = out.size();
      } else {
        throw FormatError(name_ + ": " + std::string(what) + ": decompressed bytes [" + std::to_string(at) + ", " +
                          std::to_string(offset + out.size()) + ") are not held (the image keeps [0, " +
                          std::to_string(head_.size()) + ") and [" + std::to_string(tail_at_) + ", " +
                          std::to_string(size()) + "))");
      }
    }
  }
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override {
    check_range(offset, length, what);
    if (offset + length <= head_.size()) {
      return ByteSpan(head_).subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
    }
    if (offset >= tail_at_) {
      return ByteSpan(tail_).subspan(static_cast<std::size_t>(offset - tail_at_), static_cast<std::size_t>(length));
    }
    return std::nullopt;
  }

 private:
  std::vector<std::byte> head_;
  std::vector<std::byte> tail_;
  std::uint64_t tail_at_;
  std::string name_;
};

// A growable byte buffer that does not zero what it adds (every byte is overwritten by
// decompression), with a cheap drop of its front.
class ByteBuffer {
 public:
  std::byte* data() { return data_.get() + begin_; }
  std::size_t size() const { return end_ - begin_; }
  void reserve_more(std::size_t n) {
    if (end_ + n <= capacity_) return;
    const std::size_t live = size();
    const std::size_t capacity = std::max(live + n, 2 * live);
    auto fresh = std::make_unique_for_overwrite<std::byte[]>(capacity);
    if (live != 0) std::memcpy(fresh.get(), data(), live);
    data_ = std::move(fresh);
    capacity_ = capacity;
    begin_ = 0;
    end_ = live;
  }
  void set_size(std::size_t n) { end_ = begin_ + n; }
  void append(ByteSpan bytes) {
    reserve_more(bytes.size());
    if (!bytes.empty()) std::memcpy(data() + size(), bytes.data(), bytes.size());
    end_ += bytes.size();
  }
  // Forgets the first n bytes; the rest moves to the front only when that is cheap.
  void drop_front(std::size_t n) {
    begin_ += n;
    if (begin_ >= size()) {
      std::memmove(data_.get(), data(), size());
      end_ -= begin_;
      begin_ = 0;
    }
  }
  std::vector<std::byte> take() {
    std::vector<std::byte> out(data(), data() + size());
    *this = ByteBuffer();
    return out;
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t capacity_ = 0, begin_ = 0, end_ = 0;
};

// Copies the wanted ranges out of the bytes offered in increasing order of offset.
class Delivery {
 public:
  explicit Delivery(std::span<const WantedRange> wanted) : wanted_(wanted) {}
  void start(std::uint64_t base) {
    base_ = base;
    started_ = true;
  }
  // The rest of the range that holds decompressed offset `at` (empty when none does).
  std::span<std::byte> run_at(std::uint64_t at) {
    if (!started_) return {};
    while (next_ < wanted_.size() && base_ + wanted_[next_].at + wanted_[next_].length <= at) ++next_;
    if (next_ == wanted_.size() || base_ + wanted_[next_].at > at) return {};
    const WantedRange& r = wanted_[next_];
    const std::uint64_t into = at - base_ - r.at;
    return std::span<std::byte>(r.out + into, static_cast<std::size_t>(r.length - into));
  }
  void offer(std::uint64_t at, ByteSpan bytes) {
    if (!started_ || bytes.empty()) return;
    const std::uint64_t end = at + bytes.size();
    while (next_ < wanted_.size() && base_ + wanted_[next_].at + wanted_[next_].length <= at) ++next_;
    for (std::size_t i = next_; i < wanted_.size() && base_ + wanted_[i].at < end; ++i) {
      const WantedRange& r = wanted_[i];
      const std::uint64_t lo = std::max(at, base_ + r.at), hi = std::min(end, base_ + r.at + r.length);
      if (lo < hi) {
        std::memcpy(r.out + (lo - base_ - r.at), bytes.data() + (lo - at), static_cast<std::size_t>(hi - lo));
      }
    }
  }

 private:
  std::span<const WantedRange> wanted_;
  std::uint64_t base_ = 0;
  bool started_ = false;
  std::size_t next_ = 0;
};

void check_in_file(const ByteSource& file, const format::StorageInfo& info, const std::string& label) {
  if (info.offset > file.size() || info.length > file.size() - info.offset) {
    throw FormatError(label + ": stored bytes [" + std::to_string(info.offset) + ", " +
                      std::to_string(info.offset + info.length) + ") reach past the end of the file (" +
                      std::to_string(file.size()) + " bytes)");
  }
}

void check_max(const format::ZstdReader& z, std::uint64_t max_bytes, const std::string& label) {
  if (z.position() > max_bytes) {
    throw FormatError(label + ": zstd frame decompresses to more than " + std::to_string(max_bytes) +
                      " bytes, the most this item can hold");
  }
}

// Forwards to a shared source.
class SharedSource final : public ByteSource {
 public:
  explicit SharedSource(std::shared_ptr<const ByteSource> inner) : inner_(std::move(inner)) {}
  const std::string& name() const override { return inner_->name(); }
  std::uint64_t size() const override { return inner_->size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    inner_->read(offset, out, what);
  }
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override {
    return inner_->view(offset, length, what);
  }

 private:
  std::shared_ptr<const ByteSource> inner_;
};

}  // namespace

std::optional<std::uint32_t> decompressed_crc32(const DecompressedItem& item, std::uint64_t begin, std::uint64_t end) {
  const std::string what = "CRC-32 of a record";
  if (!item.hole || end <= item.hole->offset || begin >= item.hole->offset + item.hole->size) {
    return crc32(0, *item.image->view(begin, end - begin, what));
  }
  const std::uint64_t hole_end = item.hole->offset + item.hole->size;
  if (begin > item.hole->offset || end < hole_end) return std::nullopt;
  std::uint32_t crc = crc32(0, *item.image->view(begin, item.hole->offset - begin, what));
  crc = crc32_combine(crc, item.hole_crc, item.hole->size);
  return crc32(crc, *item.image->view(hole_end, end - hole_end, what));
}

void check_ends_with_zip_end(const DecompressedItem& item, const std::string& label) {
  constexpr std::uint64_t kEndRecord = 22;  // the classic end record without comment
  const std::uint64_t size = item.image->size();
  const std::uint64_t held_from = item.hole ? item.hole->offset + item.hole->size : 0;
  const std::uint64_t from = std::max(held_from, size > kHeadBytes ? size - kHeadBytes : 0);
  const std::optional<ByteSpan> tail = item.image->view(from, size - from, "zip end record");
  const auto is_signature = [&](std::size_t i) {
    return (*tail)[i] == std::byte{0x50} && (*tail)[i + 1] == std::byte{0x4b} && (*tail)[i + 2] == std::byte{0x05} &&
           (*tail)[i + 3] == std::byte{0x06};
  };
  if (tail && tail->size() >= kEndRecord) {
    const std::size_t last = tail->size() - kEndRecord;
    if (is_signature(last) && (*tail)[last + 20] == std::byte{0} && (*tail)[last + 21] == std::byte{0}) return;
    for (std::size_t i = last; i-- > 0;) {
      if (is_signature(i)) {
        const std::uint64_t comment =
            std::to_integer<std::uint64_t>((*tail)[i + 20]) | (std::to_integer<std::uint64_t>((*tail)[i + 21]) << 8);
        const std::uint64_t end = from + i + kEndRecord + comment;
        if (end < size) {
          throw FormatError(label + ": the decompressed item has " + std::to_string(size - end) +
                            " bytes after the end of its zip archive (at " + std::to_string(end) + " of " +
                            std::to_string(size) + ")");
        }
        break;
      }
    }
  }
  throw FormatError(label + ": the decompressed item (" + std::to_string(size) +
                    " bytes) does not end with a zip end record (50 4b 05 06, no comment)");
}

std::unique_ptr<ByteSource> owning_source(std::shared_ptr<const ByteSource> image) {
  return std::make_unique<SharedSource>(std::move(image));
}

DecompressedItem decompress_item(const std::shared_ptr<const ByteSource>& file, const format::StorageInfo& info,
                                 const std::string& label, const DecompressOptions& options) {
  check_in_file(*file, info, label);
  format::ZstdReader z(file, info.offset, info.length, label);
  if (options.on_stored) z.on_stored(options.on_stored);
  const std::string name = label + " decompressed";
  Delivery delivery(options.deliver);
  // Appends up to kStepBytes to buf, whose first byte is at decompressed offset `at`, and
  // offers them to the delivery; false at the end of the frame.
  auto grow = [&](ByteBuffer& buf, std::uint64_t at) {
    const std::size_t old = buf.size();
    buf.reserve_more(kStepBytes);
    const std::size_t n = z.read_some(std::span<std::byte>(buf.data() + old, kStepBytes));
    buf.set_size(old + n);
    check_max(z, options.max_bytes, label);
    delivery.offer(at + old, ByteSpan(buf.data() + old, n));
    return n != 0;
  };

  // The first bytes: the whole item when it is small, else at least its head.
  ByteBuffer buf;
  const std::uint64_t first = std::max(options.keep_whole_bytes, kHeadBytes);
  std::optional<std::uint64_t> base;
  while (buf.size() < kHeadBytes && grow(buf, 0)) {
  }
  if (options.locate) base = options.locate(ByteSpan(buf.data(), buf.size()));
  DecompressedItem out;
  if (base) {
    delivery.start(*base);
    delivery.offer(0, ByteSpan(buf.data(), buf.size()));
    out.delivered_base = base;
  }
  while (buf.size() <= first && grow(buf, 0)) {
  }
  if (z.done()) {
    out.image = std::make_shared<HeldImage>(buf.take(), name);
    return out;
  }
  std::vector<std::byte> head(buf.data(), buf.data() + kHeadBytes);
  ByteBuffer tail;
  tail.append(ByteSpan(buf.data() + kHeadBytes, buf.size() - kHeadBytes));
  buf = ByteBuffer();
  std::uint64_t tail_at = kHeadBytes;
  std::uint32_t crc = 0;
  while (true) {
    if (const std::span<std::byte> whole_run = delivery.run_at(tail_at + tail.size());
        whole_run.size() > kTailReserve) {
      // A wanted range: decompressed straight into it (ZstdReader::read_into in place), its
      // CRC-32 taken block by block; the tail restarts after it, with its last bytes.
      const std::span<std::byte> run = whole_run.first(whole_run.size() - kTailReserve);
      crc = crc32(crc, ByteSpan(tail.data(), tail.size()));
      tail_at += tail.size();
      tail.drop_front(tail.size());
      const std::size_t n = z.read_into(
          run, [&](ByteSpan bytes) { crc = crc32(crc, bytes); }, /*in_place=*/true);
      tail_at += n;
      check_max(z, options.max_bytes, label);
      if (n < run.size()) break;  // the frame ended inside the range
      continue;
    }
    if (tail.size() > kTailSlack * kTailBytes) {
      const std::size_t drop = static_cast<std::size_t>(tail.size() - kTailBytes);
      crc = crc32(crc, ByteSpan(tail.data(), drop));
      tail.drop_front(drop);
      tail_at += drop;
    }
    if (!grow(tail, tail_at)) break;
  }
  out.in_place_bytes = z.in_place_bytes();
  out.hole = torchfile::ByteRange{kHeadBytes, tail_at - kHeadBytes};
  out.hole_crc = crc;
  out.image = std::make_shared<SparseImage>(std::move(head), tail.take(), tail_at, name);
  return out;
}

std::optional<std::uint64_t> first_data_record_offset(ByteSpan head) {
  constexpr std::size_t kLocalHeader = 30;
  for (std::size_t i = 0; i + kLocalHeader <= head.size(); ++i) {
    if (head[i] != std::byte{0x50} || head[i + 1] != std::byte{0x4b} || head[i + 2] != std::byte{0x03} ||
        head[i + 3] != std::byte{0x04}) {
      continue;
    }
    const std::size_t name_len =
        std::to_integer<std::size_t>(head[i + 26]) | (std::to_integer<std::size_t>(head[i + 27]) << 8);
    const std::size_t extra_len =
        std::to_integer<std::size_t>(head[i + 28]) | (std::to_integer<std::size_t>(head[i + 29]) << 8);
    if (i + kLocalHeader + name_len > head.size()) return std::nullopt;
    const std::string_view name(reinterpret_cast<const char*>(head.data() + i + kLocalHeader), name_len);
    const std::size_t slash = name.find('/');
    if (slash != std::string_view::npos && name.substr(slash).starts_with("/data/")) {
      return i + kLocalHeader + name_len + extra_len;
    }
  }
  return std::nullopt;
}

void read_decompressed(const std::shared_ptr<const ByteSource>& file, const format::StorageInfo& info,
                       const std::string& label, const DecompressedItem& image, std::span<const WantedRange> wanted,
                       bool to_end, const std::function<void(std::uint64_t at, ByteSpan bytes)>& on_stored) {
  check_in_file(*file, info, label);
  const std::uint64_t stream_end = image.hole ? image.hole->offset + image.hole->size : 0;
  std::optional<format::ZstdReader> z;
  auto stream = [&]() -> format::ZstdReader& {
    if (!z) {
      z.emplace(file, info.offset, info.length, label);
      if (on_stored) z->on_stored(on_stored);
    }
    return *z;
  };
  for (const WantedRange& r : wanted) {
    const std::uint64_t end = r.at + r.length;
    const std::uint64_t from_stream = std::min(end, stream_end);
    if (r.at < from_stream) {
      format::ZstdReader& s = stream();
      if (r.at < s.position()) {
        throw UsageError(label + ": read_decompressed: ranges must be sorted and disjoint (" + std::to_string(r.at) +
                         " after " + std::to_string(s.position()) + ")");
      }
      s.skip(r.at - s.position());
      const std::span<std::byte> out(r.out, static_cast<std::size_t>(from_stream - r.at));
      if (s.read_into(out, {}, /*in_place=*/true) != out.size()) {
        throw FormatError(label + ": zstd frame ends after " + std::to_string(s.position()) + " bytes, " +
                          std::to_string(r.at + out.size()) + " needed");
      }
    }
    const std::uint64_t held = std::max(r.at, from_stream);
    if (held < end) {
      image.image->read(held, std::span<std::byte>(r.out + (held - r.at), static_cast<std::size_t>(end - held)), label);
    }
  }
  if (to_end) {
    const std::uint64_t n = stream().drain();
    if (n != image.image->size()) {
      throw FormatError(label + ": zstd frame decompressed to " + std::to_string(n) + " bytes, " +
                        std::to_string(image.image->size()) + " on the first read (the file changed?)");
    }
  }
}

}  // namespace shardpoint::engine
