#include "engine/item_reader.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "engine/block_checksum.h"
#include "engine/chunking.h"

namespace shardpoint::engine {

// A window [base, base + length) of a .distcp file source. Reads through ByteSource (the
// torch.save parser's) count as header bytes; read_data() counts as data bytes.
class CountedWindow final : public ByteSource {
 public:
  CountedWindow(std::shared_ptr<const ByteSource> parent, std::uint64_t base, std::uint64_t length, std::string name)
      : parent_(std::move(parent)), base_(base), length_(length), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return length_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    parent_->read(base_ + offset, out, what);
    counts_.header_bytes += out.size();
  }
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override {
    check_range(offset, length, what);
    auto v = parent_->view(base_ + offset, length, what);
    if (v) counts_.header_bytes += length;
    return v;
  }
  void read_data(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const {
    check_range(offset, out.size(), what);
    parent_->read(base_ + offset, out, what);
    counts_.data_bytes += out.size();
  }
  ReadCounts& counts() const { return counts_; }

 private:
  std::shared_ptr<const ByteSource> parent_;
  std::uint64_t base_;
  std::uint64_t length_;
  std::string name_;
  mutable ReadCounts counts_;
};

namespace {

// One copy: `length` bytes at `src` (relative to the chunk's data start) go to `dst`
// (relative to the destination box's start).
struct Segment {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t length = 0;
};

// Walks the saved runs and the destination runs (same bytes, same order, different
// splits) together.
std::vector<Segment> pair_runs(const std::vector<ByteRange>& saved, const std::vector<ByteRange>& dest) {
  std::vector<Segment> out;
  std::size_t i = 0, j = 0;
  std::uint64_t used_i = 0, used_j = 0;
  while (i < saved.size() && j < dest.size()) {
    const std::uint64_t n = std::min(saved[i].length - used_i, dest[j].length - used_j);
    if (n > 0) {
      const std::uint64_t src = saved[i].offset + used_i;
      const std::uint64_t dst = dest[j].offset + used_j;
      if (!out.empty() && out.back().src + out.back().length == src && out.back().dst + out.back().length == dst) {
        out.back().length += n;
      } else {
        out.push_back({src, dst, n});
      }
    }
    used_i += n;
    used_j += n;
    if (used_i == saved[i].length) ++i, used_i = 0;
    if (j < dest.size() && used_j == dest[j].length) ++j, used_j = 0;
  }
  return out;
}

std::string hex(ChecksumAlgorithm a, std::uint64_t v) { return checksum_to_hex(a, v); }

}  // namespace

SavedTensorBlob::SavedTensorBlob(std::shared_ptr<const ByteSource> file, const format::StorageInfo& info,
                                 std::string fqn, const format::ChunkStorageMetadata& chunk, DType dtype)
    : fqn_(std::move(fqn)), info_(info), chunk_(chunk), dtype_(dtype) {
  if (!info_.transform_descriptors.empty()) {
    throw FormatError(describe() + ": stream transforms are not supported yet (found \"" +
                      info_.transform_descriptors.front() + "\")");
  }
  if (info_.offset > file->size() || info_.length > file->size() - info_.offset) {
    throw FormatError(describe() + ": blob [" + std::to_string(info_.offset) + ", " +
                      std::to_string(info_.offset + info_.length) + ") reaches past the end of the file (" +
                      std::to_string(file->size()) + " bytes)");
  }
  auto window = std::make_unique<CountedWindow>(
      std::move(file), info_.offset, info_.length,
      info_.relative_path + "[" + std::to_string(info_.offset) + "+" + std::to_string(info_.length) + "]");
  window_ = window.get();
  try {
    file_ = torchfile::TorchFile::open(std::move(window));
  } catch (const Error&) {
    rethrow_with_context(describe());
  }
  tensor_ = file_->tensor_of(*file_->root());
  if (tensor_ == nullptr) {
    throw FormatError(describe() + ": expected a tensor at the root of the torch.save blob, found " +
                      std::string(pickle::kind_name(file_->root()->kind())));
  }
  if (tensor_->dtype != dtype_) {
    throw FormatError(describe() + ": expected dtype " + std::string(dtype_name(dtype_)) + " (as .metadata says), found " +
                      std::string(dtype_name(tensor_->dtype)));
  }
  if (tensor_->shape != chunk_.sizes) {
    throw FormatError(describe() + ": expected a tensor of shape " + shape_to_string(chunk_.sizes) +
                      " (the chunk's sizes), found " + shape_to_string(tensor_->shape));
  }
}

SavedTensorBlob::~SavedTensorBlob() = default;

std::string SavedTensorBlob::describe() const {
  return info_.relative_path + ": item \"" + fqn_ + "\" chunk " + box_to_string(chunk_.offsets, chunk_.sizes);
}

bool SavedTensorBlob::direct() const { return tensor_->is_contiguous() && !tensor_->big_endian; }

ReadCounts SavedTensorBlob::counts() const { return window_->counts(); }

void SavedTensorBlob::read_into(const ReadItem& item, std::span<std::byte> dest, const format::Shape& dest_box_sizes,
                                const BlobChecksums& checksums) {
  const std::size_t itemsize = dtype_itemsize(dtype_);
  const std::vector<Segment> segments = pair_runs(saved_chunk_byte_ranges(item, chunk_.sizes, itemsize),
                                                  dest_byte_ranges(item, dest_box_sizes, itemsize));
  for (const Segment& s : segments) {
    if (s.dst > dest.size() || s.length > dest.size() - s.dst) {
      throw UsageError(describe() + ": destination buffer of " + std::to_string(dest.size()) +
                       " bytes is too small for [" + std::to_string(s.dst) + ", " + std::to_string(s.dst + s.length) +
                       ")");
    }
  }
  const std::string what = describe() + " data";
  const bool verify = checksums.item != nullptr && checksums.algorithm != ChecksumAlgorithm::kNone;

  if (!direct()) {
    // Slow path: the saved layout is not row-major little-endian; let the torch.save reader
    // gather (and byte-swap) the whole chunk, then copy the needed parts.
    if (verify) {
      std::vector<std::byte> blob(static_cast<std::size_t>(info_.length));
      window_->read_data(0, blob, what);
      const std::uint64_t found = checksum_of(checksums.algorithm, blob);
      if (found != checksums.item->checksum) {
        throw FormatError(describe() + ": checksum mismatch: expected " +
                          std::string(checksum_algorithm_name(checksums.algorithm)) + " " +
                          hex(checksums.algorithm, checksums.item->checksum) + ", found " + hex(checksums.algorithm, found));
      }
    }
    std::vector<std::byte> chunk(static_cast<std::size_t>(tensor_->nbytes()));
    const std::uint64_t before = window_->counts().header_bytes;
    file_->read_tensor(*tensor_, chunk);
    const std::uint64_t moved = window_->counts().header_bytes - before;
    window_->counts().header_bytes -= moved;
    window_->counts().data_bytes += moved;
    for (const Segment& s : segments) {
      std::memcpy(dest.data() + s.dst, chunk.data() + s.src, static_cast<std::size_t>(s.length));
    }
    return;
  }

  const std::uint64_t data_start =
      tensor_->storage.offset + static_cast<std::uint64_t>(tensor_->storage_offset) * itemsize;
  if (!verify) {
    for (const Segment& s : segments) {
      window_->read_data(data_start + s.src,
                         dest.subspan(static_cast<std::size_t>(s.dst), static_cast<std::size_t>(s.length)), what);
    }
    return;
  }

  // Verified: read each touched block whole, check it, copy the needed parts out.
  const std::uint64_t block = checksums.block_size;
  const ItemChecksums& entry = *checksums.item;
  if (entry.length != info_.length) {
    throw FormatError(describe() + ": checksum sidecar says the blob has " + std::to_string(entry.length) +
                      " bytes, .metadata says " + std::to_string(info_.length));
  }
  std::vector<std::byte> scratch;
  std::size_t first = 0;  // first segment that may still overlap the current block
  std::int64_t last_block = -1;
  for (std::size_t si = 0; si < segments.size(); ++si) {
    const std::uint64_t seg_begin = data_start + segments[si].src;
    const std::uint64_t seg_end = seg_begin + segments[si].length;
    for (std::uint64_t b = seg_begin / block; b * block < seg_end; ++b) {
      if (static_cast<std::int64_t>(b) <= last_block) continue;
      last_block = static_cast<std::int64_t>(b);
      const std::uint64_t b_begin = b * block;
      const std::uint64_t b_end = std::min(b_begin + block, info_.length);
      if (b >= entry.blocks.size()) {
        throw FormatError(describe() + ": checksum sidecar has " + std::to_string(entry.blocks.size()) +
                          " blocks, block " + std::to_string(b) + " needed");
      }
      scratch.resize(static_cast<std::size_t>(b_end - b_begin));
      window_->read_data(b_begin, scratch, what);
      const std::uint64_t found = checksum_of(checksums.algorithm, scratch);
      if (found != entry.blocks[b]) {
        throw FormatError(describe() + ": checksum mismatch in block " + std::to_string(b) + " (blob bytes [" +
                          std::to_string(b_begin) + ", " + std::to_string(b_end) + ")): expected " +
                          std::string(checksum_algorithm_name(checksums.algorithm)) + " " +
                          hex(checksums.algorithm, entry.blocks[b]) + ", found " + hex(checksums.algorithm, found));
      }
      while (first < segments.size() && data_start + segments[first].src + segments[first].length <= b_begin) ++first;
      for (std::size_t k = first; k < segments.size(); ++k) {
        const std::uint64_t begin = data_start + segments[k].src;
        if (begin >= b_end) break;
        const std::uint64_t lo = std::max(begin, b_begin);
        const std::uint64_t hi = std::min(begin + segments[k].length, b_end);
        if (lo >= hi) continue;
        std::memcpy(dest.data() + segments[k].dst + (lo - begin), scratch.data() + (lo - b_begin),
                    static_cast<std::size_t>(hi - lo));
      }
    }
  }
}

namespace {

class OwnedSource final : public ByteSource {
 public:
  OwnedSource(std::vector<std::byte> data, std::string name) : data_(std::move(data)), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return data_.size(); }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    if (!out.empty()) std::memcpy(out.data(), data_.data() + offset, out.size());
  }
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override {
    check_range(offset, length, what);
    return ByteSpan(data_).subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
  }

 private:
  std::vector<std::byte> data_;
  std::string name_;
};

}  // namespace

pickle::ValuePtr read_saved_object(const ByteSource& file, const format::StorageInfo& info, const std::string& fqn,
                                   const BlobChecksums& checksums, ReadCounts& counts) {
  const std::string where = info.relative_path + ": item \"" + fqn + "\"";
  if (!info.transform_descriptors.empty()) {
    throw FormatError(where + ": stream transforms are not supported yet (found \"" +
                      info.transform_descriptors.front() + "\")");
  }
  if (info.offset > file.size() || info.length > file.size() - info.offset) {
    throw FormatError(where + ": blob [" + std::to_string(info.offset) + ", " + std::to_string(info.offset + info.length) +
                      ") reaches past the end of the file (" + std::to_string(file.size()) + " bytes)");
  }
  std::vector<std::byte> blob(static_cast<std::size_t>(info.length));
  file.read(info.offset, blob, where);
  counts.data_bytes += blob.size();
  if (checksums.item != nullptr && checksums.algorithm != ChecksumAlgorithm::kNone) {
    if (checksums.item->length != info.length) {
      throw FormatError(where + ": checksum sidecar says the blob has " + std::to_string(checksums.item->length) +
                        " bytes, .metadata says " + std::to_string(info.length));
    }
    const std::uint64_t found = checksum_of(checksums.algorithm, blob);
    if (found != checksums.item->checksum) {
      throw FormatError(where + ": checksum mismatch: expected " + std::string(checksum_algorithm_name(checksums.algorithm)) +
                        " " + hex(checksums.algorithm, checksums.item->checksum) + ", found " +
                        hex(checksums.algorithm, found));
    }
  }
  std::unique_ptr<torchfile::TorchFile> torch_file;
  try {
    torch_file = torchfile::TorchFile::open(std::make_unique<OwnedSource>(
        std::move(blob), info.relative_path + "[" + std::to_string(info.offset) + "+" + std::to_string(info.length) + "]"));
  } catch (const Error&) {
    rethrow_with_context(where);
  }
  return torch_file->root();
}

}  // namespace shardpoint::engine
