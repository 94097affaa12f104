// Reading saved items back: how SavedTensorBlob reads and verifies.
//
// Opening a tensor blob reads its zip structure and data.pkl (a few hundred bytes, counted
// as header bytes), unless the load index says where the data starts. Reads of tensor data
// go from the file source into the caller's buffer with no staging when the saved tensor is
// row-major contiguous little-endian (what shardpoint and DCP write); any other saved
// layout (permuted strides, big-endian files) takes a slower path through a temporary copy
// of the chunk.
//
// Verification (a sidecar entry given): data is read straight into the destination and
// each checksum block is checked there, right after its read (while it is in cache). A
// block the item needs only part of (a reshard boundary) is handled one of two ways:
//  - alone (read_into without `pieces`, CheckpointReader): the missing parts of the block
//    are read into a scratch buffer and the checksum runs over the parts in order, so the
//    read is widened to whole blocks;
//  - together (crc32c, `pieces` given, load()): the needed part's crc32c is recorded as a
//    BlockPiece; after every rank read, the ranks exchange pieces and each block is checked
//    by combining the pieces (crc32c_combine), so a resharding load reads each needed byte
//    once, with full verification. verify_block_pieces reads only the parts no rank read
//    (a partial load).
// Why not smaller blocks: a reshard boundary falls anywhere (rows of ceil(n / world) for
// any world), so any fixed block size widens every boundary by up to a block, and the
// sidecar grows as blocks shrink; combining costs one all_gather of a few bytes per
// boundary and no bytes read.
// A bytes item is read whole and checked against the item checksum.
#include "engine/item_reader.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "core/checksum.h"
#include "engine/block_checksum.h"
#include "engine/chunking.h"
#include "engine/compressed_item.h"
#include "engine/parallel_for.h"
#include "engine/torch_file_crc.h"
#include "format/stream_transform.h"
#include "shardpoint/error.h"
#include "torchfile/zip_format.h"
#include "torchfile/zip_record_check.h"

namespace shardpoint::engine {

// A window [base, base + length) of a .distcp file source. Reads through ByteSource (the
// torch.save parser's) count as header bytes; read_data() counts as data bytes.
//
// The parser opens a blob with ~20 small reads at its two ends (end records, central
// directory, local headers, data.pkl): each end is fetched once, and small
// reads inside it are served from memory (one pread instead of ten; an end overlaps the
// tensor data by a few hundred bytes, which are then read twice).
class CountedWindow final : public ByteSource {
 public:
  // Sized to what shardpoint and PyTorch write: data starts 448 bytes into a tensor blob
  // and 732 bytes of records follow it.
  static constexpr std::uint64_t kHeadBytes = 512;
  static constexpr std::uint64_t kTailBytes = 1024;

  CountedWindow(std::shared_ptr<const ByteSource> parent, std::uint64_t base, std::uint64_t length, std::string name)
      : parent_(std::move(parent)), base_(base), length_(length), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return length_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    if (out.size() <= kTailBytes) {
      if (serve(head_, 0, std::min(length_, kHeadBytes), offset, out, what)) return;
      if (serve(tail_, tail_begin(), length_, offset, out, what)) return;
    }
    parent_->read(base_ + offset, out, what);
    counts_.header_bytes += out.size();
  }
  std::optional<ByteSpan> view(std::uint64_t offset, std::uint64_t length, std::string_view what) const override {
    check_range(offset, length, what);
    auto v = parent_->view(base_ + offset, length, what);
    if (v) counts_.header_bytes += length;
    return v;
  }
  void will_need(std::uint64_t offset, std::uint64_t length) const override {
    if (offset < length_) parent_->will_need(base_ + offset, std::min(length, length_ - offset));
  }
  void read_data(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const {
    check_range(offset, out.size(), what);
    parent_->read(base_ + offset, out, what);
    counts_.data_bytes += out.size();
  }
  ReadCounts& counts() const { return counts_; }
  // The bytes [begin, end) when one end of the blob (the parser's two reads) holds them
  // all, fetching that end if the parser has not (blobs opened from the load index).
  std::optional<ByteSpan> cached(std::uint64_t begin, std::uint64_t end) const {
    const std::uint64_t head_end = std::min(length_, kHeadBytes);
    if (end <= head_end) {
      serve(head_, 0, head_end, begin, {}, "zip records");
      return ByteSpan(head_.bytes).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin));
    }
    if (begin >= tail_begin() && end <= length_) {
      serve(tail_, tail_begin(), length_, begin, {}, "zip records");
      return ByteSpan(tail_.bytes)
          .subspan(static_cast<std::size_t>(begin - tail_begin()), static_cast<std::size_t>(end - begin));
    }
    return std::nullopt;
  }

 private:
  std::uint64_t tail_begin() const { return length_ > kTailBytes ? length_ - kTailBytes : 0; }
  struct End {
    bool loaded = false;
    std::vector<std::byte> bytes;
  };
  // Copies [offset, offset + out.size()) from the end [begin, end) when it lies inside it,
  // fetching the end on first use.
  bool serve(End& cached, std::uint64_t begin, std::uint64_t end, std::uint64_t offset, std::span<std::byte> out,
             std::string_view what) const {
    if (offset < begin || offset + out.size() > end) return false;
    if (!cached.loaded) {
      cached.bytes.resize(static_cast<std::size_t>(end - begin));
      parent_->read(base_ + begin, cached.bytes, what);
      counts_.header_bytes += cached.bytes.size();
      cached.loaded = true;
    }
    if (!out.empty()) std::memcpy(out.data(), cached.bytes.data() + (offset - begin), out.size());
    return true;
  }

  std::shared_ptr<const ByteSource> parent_;
  std::uint64_t base_;
  std::uint64_t length_;
  std::string name_;
  mutable ReadCounts counts_;
  mutable End head_, tail_;
};

namespace {

using Segment = SavedTensorBlob::Segment;

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

// Throws FormatError naming `where` when the checksum of a transformed item's stored
// (compressed) bytes is not the sidecar's. REQUIRES checksums.item.
void check_stored_checksum(const std::string& where, const BlobChecksums& checksums, std::uint64_t found) {
  if (found == checksums.item->checksum) return;
  throw FormatError(where + ": checksum mismatch of the stored (compressed) bytes: expected " +
                    std::string(checksum_algorithm_name(checksums.algorithm)) + " " +
                    hex(checksums.algorithm, checksums.item->checksum) + ", found " + hex(checksums.algorithm, found));
}

// The zip CRC-32 mismatch of the blob's data.pkl (zip_crc_mismatch's message), if it has
// one and its zip structure still opens; for blobs whose pickle did not parse.
// data_pkl_crc_mismatch (torch_file_crc.h) of the blob `info` of `file`.
std::optional<std::string> blob_data_pkl_crc_mismatch(std::shared_ptr<const ByteSource> file,
                                                      const format::StorageInfo& info, const std::string& where) {
  const CountedWindow window(std::move(file), info.offset, info.length, where);
  return data_pkl_crc_mismatch(window, info.offset, where);
}

}  // namespace

SavedTensorBlob::SavedTensorBlob(std::shared_ptr<const ByteSource> file, const format::StorageInfo& info,
                                 std::string fqn, const format::ChunkStorageMetadata& chunk, DType dtype,
                                 std::optional<std::uint64_t> data_offset, bool defer_transformed)
    : fqn_(std::move(fqn)), info_(info), chunk_(chunk), dtype_(dtype) {
  const format::StreamTransform transform = format::parse_transforms(info_.transform_descriptors, describe());
  if (info_.offset > file->size() || info_.length > file->size() - info_.offset) {
    throw FormatError(describe() + ": blob [" + std::to_string(info_.offset) + ", " +
                      std::to_string(info_.offset + info_.length) + ") reaches past the end of the file (" +
                      std::to_string(file->size()) + " bytes)");
  }
  if (transform != format::StreamTransform::kNone) {
    // The load index's data_offset is for untransformed blobs only.
    if (defer_transformed) {
      stored_file_ = file;
      open_pending_ = true;
    } else {
      open_decompressed(file);
    }
    return;
  }
  auto window = std::make_unique<CountedWindow>(
      file, info_.offset, info_.length,
      info_.relative_path + "[" + std::to_string(info_.offset) + "+" + std::to_string(info_.length) + "]");
  window_ = window.get();
  if (data_offset) {
    // The load index says where the data starts: what shardpoint wrote, a row-major
    // little-endian chunk; the blob's records are read only if verification needs them.
    window_owner_ = std::move(window);
    layout_.nbytes = static_cast<std::uint64_t>(volume(chunk_.sizes)) * dtype_itemsize(dtype_);
    layout_.data_start = *data_offset;
    if (layout_.data_start > info_.length || layout_.nbytes > info_.length - layout_.data_start) {
      throw FormatError(describe() + ": the load index puts " + std::to_string(layout_.nbytes) +
                        " bytes of tensor data at " + std::to_string(layout_.data_start) + ", past the blob's " +
                        std::to_string(info_.length) + " bytes");
    }
    return;
  }
  try {
    file_ = torchfile::TorchFile::open(std::move(window));
  } catch (const Error&) {
    // A damaged data.pkl often fails to parse: name the cause when its CRC-32 shows it.
    if (std::optional<std::string> crc = blob_data_pkl_crc_mismatch(std::move(file), info_, describe())) {
      throw FormatError(*crc);
    }
    rethrow_with_context(describe());
  }
  check_tensor();
}

void SavedTensorBlob::check_tensor() {
  tensor_ = file_->tensor_of(*file_->root());
  if (tensor_ == nullptr) {
    throw FormatError(describe() + ": expected a tensor at the root of the torch.save blob, found " +
                      std::string(pickle::kind_name(file_->root()->kind())));
  }
  if (tensor_->dtype != dtype_) {
    throw FormatError(describe() + ": expected dtype " + std::string(dtype_name(dtype_)) +
                      " (as .metadata says), found " + std::string(dtype_name(tensor_->dtype)));
  }
  if (tensor_->shape != chunk_.sizes) {
    throw FormatError(describe() + ": expected a tensor of shape " + shape_to_string(chunk_.sizes) +
                      " (the chunk's sizes), found " + shape_to_string(tensor_->shape));
  }
  layout_.data_start =
      tensor_->storage.offset + static_cast<std::uint64_t>(tensor_->storage_offset) * dtype_itemsize(dtype_);
  layout_.nbytes = tensor_->nbytes();
  layout_.direct = tensor_->is_contiguous() && !tensor_->big_endian;
}

namespace {

// A zstd item that decompresses to at most this is held whole while it is read; larger
// ones keep only their zip records (compressed_item.h). 8 MiB: one slab of a consolidate.
constexpr std::uint64_t kKeepWholeBytes = std::uint64_t{8} << 20;
// What a tensor item may hold besides its data: zip records and data.pkl (~1.5 KiB in
// torch.save's), with room for any layout.
constexpr std::uint64_t kRecordAllowance = std::uint64_t{16} << 20;

}  // namespace

bool SavedTensorBlob::open_decompressed(const std::shared_ptr<const ByteSource>& file,
                                        std::span<const WantedRange> deliver,
                                        const std::function<void(std::uint64_t, ByteSpan)>& on_stored) {
  stored_file_ = file;
  open_pending_ = false;
  const std::string label = describe() + " (" + info_.transform_descriptors.front() + ")";
  const std::uint64_t nbytes = static_cast<std::uint64_t>(volume(chunk_.sizes)) * dtype_itemsize(dtype_);
  DecompressOptions options;
  // A saved view may keep a larger storage; twice the chunk bounds what DCP writes.
  options.max_bytes = 2 * nbytes + kRecordAllowance;
  // A chunk larger than that goes straight to head + tail (no whole-image buffer first), and
  // so does one whose every byte is delivered now: decompressed straight into the
  // destination, with no later read to serve from the image.
  std::uint64_t delivered_bytes = 0;
  for (const WantedRange& r : deliver) delivered_bytes += r.length;
  options.keep_whole_bytes = nbytes < kKeepWholeBytes && delivered_bytes < nbytes ? kKeepWholeBytes : 0;
  options.on_stored = on_stored;
  options.deliver = deliver;
  if (!deliver.empty()) options.locate = first_data_record_offset;
  // A sparse image that the parser cannot read whole (records outside its head and tail) or
  // whose tensor is not one row-major run inside the hole is decompressed again, whole.
  bool delivered = false;
  for (const bool whole : {false, true}) {
    if (whole) {
      // Again, whole: the stored bytes were seen and nothing more is copied out.
      delivered = false;
      options.keep_whole_bytes = options.max_bytes;
      options.on_stored = {};
      options.locate = {};
    }
    decompressed_ = std::make_unique<DecompressedItem>(decompress_item(file, info_, label, options));
    check_ends_with_zip_end(*decompressed_, label);
    if (!whole) delivered = decompressed_->delivered_base.has_value();
    const std::shared_ptr<const ByteSource>& image = decompressed_->image;
    auto window = std::make_unique<CountedWindow>(image, 0, image->size(), image->name());
    window_ = window.get();
    const bool sparse = decompressed_->hole.has_value();
    try {
      file_ = torchfile::TorchFile::open(std::move(window));
    } catch (const Error&) {
      if (sparse) continue;
      rethrow_with_context(describe());
    }
    check_tensor();
    delivered = delivered && layout_.direct && decompressed_->delivered_base == layout_.data_start;
    const torchfile::ZipEntry* record = file_->record("data/" + tensor_->storage_key);
    const bool stored = record != nullptr && record->method == torchfile::zip::kMethodStored;
    if (sparse) {
      const torchfile::ByteRange hole = *decompressed_->hole;
      if (!layout_.direct || !stored || hole.offset < record->data_offset ||
          hole.offset + hole.size > record->data_offset + record->uncompressed_size) {
        continue;
      }
    }
    // The tensor record's CRC-32: the image holds it, or its bytes around the hole and the
    // hole's CRC-32 taken in passing.
    if (stored) {
      const std::optional<std::uint32_t> crc =
          decompressed_crc32(*decompressed_, record->data_offset, record->data_offset + record->uncompressed_size);
      if (crc && *crc != record->crc32) {
        throw FormatError(describe() + ": zip CRC-32 mismatch in record \"" + record->name + "\" (decompressed from " +
                          info_.transform_descriptors.front() + "): expected " + torchfile::crc32_hex(record->crc32) +
                          ", found " + torchfile::crc32_hex(*crc));
      }
    }
    return delivered;
  }
  return false;
}

SavedTensorBlob::~SavedTensorBlob() = default;

std::string SavedTensorBlob::describe() const {
  return info_.relative_path + ": item \"" + fqn_ + "\" chunk " + box_to_string(chunk_.offsets, chunk_.sizes);
}

bool SavedTensorBlob::direct() const { return layout_.direct; }

ReadCounts SavedTensorBlob::counts() const { return window_ != nullptr ? window_->counts() : ReadCounts{}; }

void SavedTensorBlob::read_into(const ReadItem& item, std::span<std::byte> dest, const format::Shape& dest_box_sizes,
                                const BlobChecksums& checksums, std::vector<BlockPiece>* pieces) {
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

  if (open_pending_) {
    // One pass: the needed bytes are copied out while the item is decompressed to open it.
    std::vector<WantedRange> wanted;
    wanted.reserve(segments.size());
    std::uint64_t moved = 0;
    for (const Segment& s : segments) {
      wanted.push_back({s.src, s.length, dest.data() + s.dst});
      moved += s.length;
    }
    std::sort(wanted.begin(), wanted.end(), [](const WantedRange& a, const WantedRange& b) { return a.at < b.at; });
    if (verify && checksums.item->length != info_.length) {
      throw FormatError(describe() + ": checksum sidecar says the blob has " + std::to_string(checksums.item->length) +
                        " bytes, .metadata says " + std::to_string(info_.length));
    }
    StreamingChecksum sum(verify ? checksums.algorithm : ChecksumAlgorithm::kNone);
    std::function<void(std::uint64_t, ByteSpan)> on_stored;
    if (verify) on_stored = [&](std::uint64_t, ByteSpan bytes) { sum.update(bytes); };
    if (open_decompressed(stored_file_, wanted, on_stored)) {
      window_->counts().data_bytes += moved;
      if (verify) check_stored_checksum(describe(), checksums, sum.value());
      if (!verify && checksums.zip_crc != nullptr) check_small_zip_records(*checksums.zip_crc);
      return;
    }
  }
  if (decompressed_ && (decompressed_->hole || verify)) {
    read_decompressed_into(segments, dest, checksums, what);
    return;
  }

  ZipCrcLedger* const zip_ledger = !verify && file_ != nullptr ? checksums.zip_crc : nullptr;
  const DataRecord* const zip_record = zip_ledger != nullptr ? zip_data_record(*zip_ledger) : nullptr;

  if (!direct()) {
    // Slow path: the saved layout is not row-major little-endian; let the torch.save reader
    // gather (and byte-swap) the whole chunk, then copy the needed parts.
    if (zip_record != nullptr) {
      std::vector<std::byte> record(static_cast<std::size_t>(zip_record->length));
      window_->read_data(zip_record->data_offset, record, what);
      zip_ledger->add_piece(*zip_record, 0, record.size(), crc32(0, record));
    }
    if (verify) {
      std::vector<std::byte> blob(static_cast<std::size_t>(info_.length));
      window_->read_data(0, blob, what);
      const std::uint64_t found = checksum_of(checksums.algorithm, blob);
      if (found != checksums.item->checksum) {
        throw FormatError(
            describe() + ": checksum mismatch: expected " + std::string(checksum_algorithm_name(checksums.algorithm)) +
            " " + hex(checksums.algorithm, checksums.item->checksum) + ", found " + hex(checksums.algorithm, found));
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

  const std::uint64_t data_start = layout_.data_start;
  if (zip_record != nullptr) {
    for (const Segment& s : segments) {
      read_zip_checked(data_start + s.src, data_start + s.src + s.length, dest.data() + s.dst, *zip_ledger, what);
    }
    return;
  }
  if (!verify) {
    for (const Segment& s : segments) {
      window_->read_data(data_start + s.src,
                         dest.subspan(static_cast<std::size_t>(s.dst), static_cast<std::size_t>(s.length)), what);
    }
    return;
  }

  read_verified(segments, dest, checksums, pieces, what);
}

namespace {

// Verified reads (whole blocks and pieces of blocks) go into the destination this many
// bytes per pread at most and are hashed right after each read, while the bytes are still
// in the core's cache; with much larger reads the checksum pass goes to memory instead
// (1 MiB reads cost the checksum 1.6x as much on warm loads).
constexpr std::uint64_t kVerifiedReadBytes = std::uint64_t{256} << 10;

}  // namespace

void SavedTensorBlob::read_verified(const std::vector<Segment>& segments, std::span<std::byte> dest,
                                    const BlobChecksums& checksums, std::vector<BlockPiece>* pieces,
                                    const std::string& what) {
  const std::uint64_t data_start = layout_.data_start;
  const std::uint64_t block = checksums.block_size;
  const ItemChecksums& entry = *checksums.item;
  if (entry.length != info_.length) {
    throw FormatError(describe() + ": checksum sidecar says the blob has " + std::to_string(entry.length) +
                      " bytes, .metadata says " + std::to_string(info_.length));
  }
  if (block == 0) throw FormatError(describe() + ": checksum sidecar has block size 0");
  const bool combine_later = pieces != nullptr && checksums.algorithm == ChecksumAlgorithm::kCrc32c;

  // The parts of one block read so far (blob offsets, where the bytes now are and, when
  // combining later, their crc32c taken as they were read).
  struct Part {
    std::uint64_t begin, end;
    const std::byte* data;
    std::uint32_t crc = 0;
  };
  std::vector<Part> parts;
  std::uint64_t parts_block = 0;
  std::vector<std::byte> scratch;
  auto finish_partial_block = [&] {
    if (parts.empty()) return;
    if (combine_later) {
      // The zip records in this block (before and after the tensor data) were fetched by
      // the parser: they are pieces too, so no rank reads them again.
      const std::uint64_t b_begin = parts_block * block;
      const std::uint64_t b_end = std::min(b_begin + block, info_.length);
      const std::uint64_t data_end = data_start + layout_.nbytes;
      for (auto [lo, hi] :
           {std::pair{b_begin, std::min(b_end, data_start)}, std::pair{std::max(b_begin, data_end), b_end}}) {
        if (lo >= hi) continue;
        if (std::optional<ByteSpan> held = window_->cached(lo, hi)) {
          parts.push_back(Part{lo, hi, held->data(), crc32c(0, *held)});
        }
      }
      std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.begin < b.begin; });
      for (const Part& p : parts) {
        if (!pieces->empty() && pieces->back().file == info_.relative_path &&
            pieces->back().blob_offset == info_.offset && pieces->back().end == p.begin && p.begin % block != 0) {
          // Continues the same block.
          pieces->back().crc = crc32c_combine(pieces->back().crc, p.crc, p.end - p.begin);
          pieces->back().end = p.end;
        } else {
          pieces->push_back(BlockPiece{info_.relative_path, info_.offset, p.begin, p.end, p.crc});
        }
      }
    } else {
      // Alone: read what this item does not need of the block, hash the parts in order.
      const std::uint64_t b_begin = parts_block * block;
      const std::uint64_t b_end = std::min(b_begin + block, info_.length);
      std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.begin < b.begin; });
      StreamingChecksum h(checksums.algorithm);
      std::uint64_t pos = b_begin;
      auto gap = [&](std::uint64_t until) {
        if (until <= pos) return;
        if (std::optional<ByteSpan> held = window_->cached(pos, until)) {
          h.update(*held);  // zip records the parser fetched
        } else {
          scratch.resize(static_cast<std::size_t>(until - pos));
          window_->read_data(pos, scratch, what);
          h.update(scratch);
        }
        pos = until;
      };
      for (const Part& p : parts) {
        gap(p.begin);
        if (p.end <= pos) continue;
        const std::uint64_t from = std::max(p.begin, pos);
        h.update(ByteSpan(p.data + (from - p.begin), static_cast<std::size_t>(p.end - from)));
        pos = p.end;
      }
      gap(b_end);
      if (h.value() != entry.blocks[parts_block]) {
        throw FormatError(block_checksum_mismatch(describe(), checksums.algorithm, parts_block, b_begin, b_end,
                                                  entry.blocks[parts_block], h.value()));
      }
    }
    parts.clear();
  };

  for (const Segment& s : segments) {
    std::uint64_t pos = data_start + s.src;
    const std::uint64_t end = pos + s.length;
    std::byte* out = dest.data() + s.dst;
    while (pos < end) {
      const std::uint64_t b = pos / block;
      check_block_index(entry, b);
      const std::uint64_t b_begin = b * block;
      const std::uint64_t b_end = std::min(b_begin + block, info_.length);
      if (pos == b_begin && end >= b_end) {
        // A run of whole blocks: straight into the destination, each checked in place.
        std::uint64_t run_end = b_end;
        while (run_end < end && std::min(run_end + block, info_.length) <= end) {
          run_end = std::min(run_end + block, info_.length);
        }
        read_whole_blocks(pos, run_end, out, checksums, what);
        out += run_end - pos;
        pos = run_end;
        continue;
      }
      // Part of a block: read what is needed, verify when the block is done.
      const std::uint64_t piece_end = std::min(end, b_end);
      if (!parts.empty() && parts_block != b) finish_partial_block();
      parts_block = b;
      Part part{pos, piece_end, out};
      read_then_hash(pos, piece_end, out, what, [&](std::uint64_t, ByteSpan bytes) {
        if (combine_later) part.crc = crc32c(part.crc, bytes);
      });
      parts.push_back(part);
      out += piece_end - pos;
      pos = piece_end;
    }
  }
  finish_partial_block();
}

void SavedTensorBlob::check_small_zip_records(ZipCrcLedger& ledger) {
  if (zip_records_checked_) return;
  // The data record's CRC-32 was checked at open (sparse image) or is checked by the
  // caller's reads (held image); the small records are in the image.
  if (ledger.claim_blob(info_.relative_path, info_.offset)) {
    const torchfile::ZipEntry* data = file_->record("data/" + tensor_->storage_key);
    ledger.count(
        check_records_but(file_->archive(), data != nullptr ? data->name : std::string(), info_.offset, describe()));
  }
  zip_records_checked_ = true;
}

void SavedTensorBlob::read_decompressed_into(const std::vector<Segment>& segments, std::span<std::byte> dest,
                                             const BlobChecksums& checksums, const std::string& what) {
  const bool verify = checksums.item != nullptr && checksums.algorithm != ChecksumAlgorithm::kNone;
  if (verify && checksums.item->length != info_.length) {
    throw FormatError(describe() + ": checksum sidecar says the blob has " + std::to_string(checksums.item->length) +
                      " bytes, .metadata says " + std::to_string(info_.length));
  }
  if (!verify && checksums.zip_crc != nullptr) check_small_zip_records(*checksums.zip_crc);
  if (!direct()) throw FormatError(describe() + ": internal: a transformed blob read from its stream must be direct");
  std::vector<WantedRange> wanted;
  wanted.reserve(segments.size());
  for (const Segment& s : segments) {
    wanted.push_back({layout_.data_start + s.src, s.length, dest.data() + s.dst});
  }
  std::sort(wanted.begin(), wanted.end(), [](const WantedRange& a, const WantedRange& b) { return a.at < b.at; });
  StreamingChecksum sum(verify ? checksums.algorithm : ChecksumAlgorithm::kNone);
  std::function<void(std::uint64_t, ByteSpan)> on_stored;
  if (verify) on_stored = [&](std::uint64_t, ByteSpan bytes) { sum.update(bytes); };
  read_decompressed(stored_file_, info_, what, *decompressed_, wanted, verify, on_stored);
  std::uint64_t moved = 0;
  for (const Segment& s : segments) moved += s.length;
  window_->counts().data_bytes += moved;
  if (verify) check_stored_checksum(describe(), checksums, sum.value());
}

void SavedTensorBlob::check_block_index(const ItemChecksums& entry, std::uint64_t block) const {
  if (block >= entry.blocks.size()) {
    throw FormatError(describe() + ": checksum sidecar has " + std::to_string(entry.blocks.size()) + " blocks, block " +
                      std::to_string(block) + " needed");
  }
}

void SavedTensorBlob::read_whole_blocks(std::uint64_t begin, std::uint64_t end, std::byte* out,
                                        const BlobChecksums& checksums, const std::string& what) {
  const std::uint64_t block = checksums.block_size;
  const ItemChecksums& entry = *checksums.item;
  StreamingChecksum sum(checksums.algorithm);
  read_then_hash(begin, end, out, what, [&](std::uint64_t at, ByteSpan bytes) {
    const std::uint64_t read_end = at + bytes.size();
    for (std::uint64_t p = at; p < read_end;) {
      const std::uint64_t k = p / block;
      check_block_index(entry, k);
      const std::uint64_t k_end = std::min((k + 1) * block, info_.length);
      const std::uint64_t piece_end = std::min(k_end, read_end);
      sum.update(bytes.subspan(static_cast<std::size_t>(p - at), static_cast<std::size_t>(piece_end - p)));
      if (piece_end == k_end) {
        if (sum.value() != entry.blocks[k]) {
          throw FormatError(block_checksum_mismatch(describe(), checksums.algorithm, k, k * block, k_end,
                                                    entry.blocks[k], sum.value()));
        }
        sum.reset();
      }
      p = piece_end;
    }
  });
}

void SavedTensorBlob::read_then_hash(std::uint64_t begin, std::uint64_t end, std::byte* out, const std::string& what,
                                     const std::function<void(std::uint64_t at, ByteSpan bytes)>& hash) {
  for (std::uint64_t at = begin; at < end;) {
    const std::uint64_t read_end = std::min(at + kVerifiedReadBytes, end);
    const std::span<std::byte> bytes(out + (at - begin), static_cast<std::size_t>(read_end - at));
    window_->read_data(at, bytes, what);
    hash(at, bytes);
    at = read_end;
  }
}

const DataRecord* SavedTensorBlob::zip_data_record(ZipCrcLedger& ledger) {
  if (!zip_records_checked_) {
    const torchfile::ZipEntry* data = file_->record("data/" + tensor_->storage_key);
    const std::string data_name = data != nullptr ? data->name : std::string();
    if (ledger.claim_blob(info_.relative_path, info_.offset)) {
      ledger.count(check_records_but(file_->archive(), data_name, info_.offset, describe()));
    }
    if (data != nullptr && data->method == torchfile::zip::kMethodStored) {
      zip_data_ = DataRecord{info_.relative_path,     info_.offset, data->name, data->data_offset,
                             data->uncompressed_size, data->crc32,  describe()};
    }
    zip_records_checked_ = true;
  }
  return zip_data_ ? &*zip_data_ : nullptr;
}

void SavedTensorBlob::read_zip_checked(std::uint64_t begin, std::uint64_t end, std::byte* out, ZipCrcLedger& ledger,
                                       const std::string& what) {
  const DataRecord& record = *zip_data_;
  if (begin < record.data_offset || end > record.data_offset + record.length) {
    throw FormatError(describe() + ": tensor bytes [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") lie outside its zip record \"" + record.name + "\"");
  }
  std::uint32_t crc = 0;
  read_then_hash(begin, end, out, what, [&](std::uint64_t, ByteSpan bytes) { crc = crc32(crc, bytes); });
  ledger.add_piece(record, begin - record.data_offset, end - record.data_offset, crc);
}

std::shared_ptr<const ByteSource> SourceCache::get(const std::string& key, std::uint64_t first_read_bytes) {
  MutexLock lock(mu_);
  auto it = sources_.find(key);
  if (it != sources_.end()) return it->second;
  storage::SourceOptions options;
  options.prefer_mmap = false;
  options.first_read_bytes = first_read_bytes;
  std::shared_ptr<const ByteSource> source = storage_.open_source(key, options);
  sources_.emplace(key, source);
  return source;
}

void FirstReads::add(const std::string& file, std::uint64_t offset, std::uint64_t length) {
  if (files_.empty() || files_.back().first != file) {
    files_.emplace_back(file, 0);
    run_open_ = true;
  }
  std::uint64_t& end = files_.back().second;
  if (!run_open_ || offset > end + kRunGap) {
    run_open_ = false;
    return;
  }
  end = std::max(end, offset + length);
}

void SourceCache::open_all(const std::vector<std::pair<std::string, std::uint64_t>>& first_reads, std::size_t threads) {
  std::vector<std::pair<std::string, std::uint64_t>> closed;
  {
    MutexLock lock(mu_);
    for (const auto& file : first_reads) {
      if (!sources_.contains(file.first)) closed.push_back(file);
    }
  }
  std::vector<std::shared_ptr<const ByteSource>> opened(closed.size());
  parallel_for(closed.size(), threads, [&](std::size_t i) {
    storage::SourceOptions options;
    options.prefer_mmap = false;
    options.first_read_bytes = closed[i].second;
    opened[i] = storage_.open_source(closed[i].first, options);
  });
  MutexLock lock(mu_);
  for (std::size_t i = 0; i < closed.size(); ++i) sources_.try_emplace(closed[i].first, std::move(opened[i]));
}

std::vector<ByteRange> SavedTensorBlob::needed_blob_ranges(const std::vector<const ReadItem*>& items,
                                                           const format::Shape& chunk_sizes, std::size_t itemsize,
                                                           std::uint64_t blob_length) {
  std::vector<ByteRange> ranges;
  auto add = [&](std::uint64_t begin, std::uint64_t end) {
    end = std::min(end, blob_length);
    if (begin < end) ranges.push_back({begin, end - begin});
  };
  add(0, kHeaderAllowance);
  add(blob_length > kHeaderAllowance ? blob_length - kHeaderAllowance : 0, blob_length);
  for (const ReadItem* item : items) {
    std::vector<ByteRange> runs;
    try {
      runs = saved_chunk_byte_ranges(*item, chunk_sizes, itemsize);
    } catch (const Error&) {
      continue;  // read_into reports it
    }
    if (runs.empty()) continue;
    const std::uint64_t lo = runs.front().offset;
    const std::uint64_t hi = runs.back().offset + runs.back().length;
    add(lo, hi + kHeaderAllowance);
  }
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    if (!merged.empty() && r.offset <= merged.back().offset + merged.back().length) {
      merged.back().length =
          std::max(merged.back().offset + merged.back().length, r.offset + r.length) - merged.back().offset;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

}  // namespace shardpoint::engine
