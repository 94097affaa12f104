// Reading saved items back (layout: docs/dcp-format.md §2.1; zstd items §2.4). SavedTensorBlob opens one
// tensor blob of a .distcp file as the torch.save archive it is and copies only the byte
// runs a ReadItem needs (load_plan.h) into the destination buffer (bytes items:
// saved_object.h; the pieces of blocks the ranks verify together: block_pieces.h).
//
// With a sidecar entry every byte copied is verified against its checksum block. Without
// one (PyTorch's checkpoints) and with BlobChecksums::zip_crc set, the zip CRC-32 of every
// record is checked instead: the small records when the blob is first read, the tensor data
// as pieces in the ledger (zip_crc_ledger.h), a record read only in part left unchecked.
// A block an item needs only part of (a reshard boundary) is either completed by reading
// its missing parts (read_into without `pieces`) or recorded as a BlockPiece for
// verify_block_pieces
// (crc32c with `pieces`). How and why: the top of item_reader.cc. Mismatches throw
// FormatError naming the file, the fqn, the block and expected vs found.
//
// A zstd item is opened from its decompressed image (engine/compressed_item.h): one pass
// at open (a deferred open decompresses the read's long destination runs straight into
// place during it), and one more per later read_into that decompresses up to the last byte
// it needs (bytes past the image's hole are copied from the image). A sidecar entry of a zstd item
// covers its stored bytes, checked whole.
//
// Thread-safety: a SavedTensorBlob is used by one thread at a time; different ones over the
// same file source may be used from different threads. SourceCache is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/byte_stream.h"
#include "engine/block_pieces.h"
#include "engine/checksum_sidecar.h"
#include "engine/load_plan.h"
#include "engine/zip_crc_ledger.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/metadata.h"
#include "shardpoint/mutex.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/torch_file.h"

namespace shardpoint::engine {

// How to verify one blob: the sidecar's algorithm and block size and the blob's entry;
// without an entry, the zip CRC-32s of its records into zip_crc when that is set.
struct BlobChecksums {
  ChecksumAlgorithm algorithm = ChecksumAlgorithm::kNone;
  std::uint64_t block_size = 0;
  const ItemChecksums* item = nullptr;
  ZipCrcLedger* zip_crc = nullptr;  // not owned; outlives the reads
};

// The sources of a checkpoint's files, each opened once and shared by the reader threads.
// pread, not mmap: blob reads land straight in the caller's buffers, and mapped pages would
// count in the process's RSS (loads and consolidate keep RSS within a bound).
// Thread-safe.
class SourceCache {
 public:
  explicit SourceCache(storage::Storage& storage) : storage_(storage) {}
  // The source of key, opened now unless it is open already (first_read_bytes: as
  // storage::SourceOptions, for an open now).
  std::shared_ptr<const ByteSource> get(const std::string& key, std::uint64_t first_read_bytes = 0);
  // Opens the files not open yet, on up to `threads` threads at once (an object store's opens
  // are requests): each key with the first_read_bytes the caller will read it from
  // (storage::SourceOptions). No open starts after one failed; the first error is rethrown
  // once the threads have joined.
  void open_all(const std::vector<std::pair<std::string, std::uint64_t>>& first_reads, std::size_t threads);

 private:
  storage::Storage& storage_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<const ByteSource>> sources_ SP_GUARDED_BY(mu_);
};

// How far a reader's first run of needed bytes goes in each file it reads
// (storage::SourceOptions::first_read_bytes): fed the ranges in reading order, a file's
// ranges together and in file order; the run starts with a range within kRunGap of the
// file's start and takes the ranges that follow with gaps up to kRunGap (0 when the first
// range starts further in).
class FirstReads {
 public:
  // Bytes a run may skip: what a connection moves in about one round trip (1 MiB at
  // 100 MB/s in 10 ms), so one GET reads through a gap rather than a second GET after it
  // (another rank's first file holds its own small shards between the replicated ones).
  static constexpr std::uint64_t kRunGap = std::uint64_t{1} << 20;

  void add(const std::string& file, std::uint64_t offset, std::uint64_t length);
  // (file, first_read_bytes), in the order the files came.
  const std::vector<std::pair<std::string, std::uint64_t>>& files() const { return files_; }

 private:
  std::vector<std::pair<std::string, std::uint64_t>> files_;
  bool run_open_ = false;  // the last file's run may still grow
};

class CountedWindow;
struct DecompressedItem;
struct WantedRange;

class SavedTensorBlob {
 public:
  // Opens the blob `info` of the .distcp file `file` (a source over the whole file) and
  // checks that its root is a tensor of `dtype` with shape `chunk_sizes`. `fqn` and
  // `chunk` name the item in errors. With `data_offset` (from the load index, for blobs
  // shardpoint wrote) the blob is not parsed: its data is the chunk, row-major
  // little-endian, from that blob offset. Throws FormatError ("<file>: item \"fqn\" chunk
  // [..]: expected ..., found ..."), StorageError.
  // `defer_transformed`: a zstd item is opened by the first read_into (whose bytes are then
  // copied out during the one decompression that opening takes) instead of here; its
  // errors come from that read_into. For callers that read right after constructing.
  SavedTensorBlob(std::shared_ptr<const ByteSource> file, const format::StorageInfo& info, std::string fqn,
                  const format::ChunkStorageMetadata& chunk, DType dtype,
                  std::optional<std::uint64_t> data_offset = std::nullopt, bool defer_transformed = false);
  ~SavedTensorBlob();
  SavedTensorBlob(const SavedTensorBlob&) = delete;
  SavedTensorBlob& operator=(const SavedTensorBlob&) = delete;

  // True when reads go straight into the destination (row-major contiguous little-endian).
  bool direct() const;
  // Blob offset of the chunk's first element (what the load index records).
  std::uint64_t data_start() const { return layout_.data_start; }

  // Copies the part of this chunk that `item` names into `dest` (the rank's box, row-major,
  // sizes `dest_box_sizes`). REQUIRES item.storage_index is this chunk. With
  // checksums.item set, verifies what it reads: whole blocks here; partial
  // blocks here too when `pieces` is null or the algorithm is not crc32c, else appended to
  // *pieces for verify_block_pieces. Without it and with checksums.zip_crc set (REQUIRES
  // the blob was parsed: no data_offset), checks the zip CRC-32s (above). Throws
  // FormatError / StorageError naming the file and fqn (and the zip record and byte range
  // on a CRC-32 mismatch).
  void read_into(const ReadItem& item, std::span<std::byte> dest, const format::Shape& dest_box_sizes,
                 const BlobChecksums& checksums, std::vector<BlockPiece>* pieces = nullptr);

  // One copy: `length` bytes at `src` (relative to the chunk's data start) go to `dst`
  // (relative to the destination box's start).
  struct Segment {
    std::uint64_t src = 0;
    std::uint64_t dst = 0;
    std::uint64_t length = 0;
  };

  // The blob bytes read_into will read for `items` (blob-relative, sorted, merged), for
  // read-ahead before the blob is opened: the head and the tail (zip records, data.pkl:
  // kHeaderAllowance each) and the needed data, whose start inside the blob is not known
  // yet (at most kHeaderAllowance past the blob start in what shardpoint and DCP write).
  static constexpr std::uint64_t kHeaderAllowance = 4096;
  static std::vector<ByteRange> needed_blob_ranges(const std::vector<const ReadItem*>& items,
                                                   const format::Shape& chunk_sizes, std::size_t itemsize,
                                                   std::uint64_t blob_length);

  ReadCounts counts() const;

 private:
  std::string describe() const;
  void read_verified(const std::vector<Segment>& segments, std::span<std::byte> dest, const BlobChecksums& checksums,
                     std::vector<BlockPiece>* pieces, const std::string& what);
  // Throws FormatError when the sidecar entry has no block `block`.
  void check_block_index(const ItemChecksums& entry, std::uint64_t block) const;
  // Blob bytes [begin, end), whole blocks only, into out, each block checked against the sidecar.
  void read_whole_blocks(std::uint64_t begin, std::uint64_t end, std::byte* out, const BlobChecksums& checksums,
                         const std::string& what);
  // Blob bytes [begin, end) into out, in reads of at most kVerifiedReadBytes, each handed
  // to `hash` (with its blob offset) right after it, while the bytes are in cache.
  void read_then_hash(std::uint64_t begin, std::uint64_t end, std::byte* out, const std::string& what,
                      const std::function<void(std::uint64_t at, ByteSpan bytes)>& hash);
  // Opens a transformed item (docs/dcp-format.md §2.4) from its decompressed image.
  // With `deliver` (ranges relative to the chunk's data start), copies them out during the
  // decompression and returns true when they were copied from the data start the parsed
  // blob confirms (else the caller reads them again).
  bool open_decompressed(const std::shared_ptr<const ByteSource>& file, std::span<const WantedRange> deliver = {},
                         const std::function<void(std::uint64_t, ByteSpan)>& on_stored = {});
  // The dtype, shape and layout checks of the tensor at the blob's root; sets layout_.
  void check_tensor();
  // read_into for a transformed item read from its stream (a sparse image) or verified
  // against a sidecar entry over its stored bytes.
  void read_decompressed_into(const std::vector<Segment>& segments, std::span<std::byte> dest,
                              const BlobChecksums& checksums, const std::string& what);
  // A transformed blob's zip records other than its tensor data, checked once into ledger.
  void check_small_zip_records(ZipCrcLedger& ledger);
  // The zip CRC-32 checks of read_into: checks the small records on first use and returns
  // the data record, or nullptr when its CRC-32 cannot be checked (a compressed record).
  const DataRecord* zip_data_record(ZipCrcLedger& ledger);
  // Blob bytes [begin, end) of the chunk's data into out, their CRC-32 added to the ledger.
  void read_zip_checked(std::uint64_t begin, std::uint64_t end, std::byte* out, ZipCrcLedger& ledger,
                        const std::string& what);

  std::string fqn_;
  format::StorageInfo info_;
  format::ChunkStorageMetadata chunk_;
  DType dtype_;
  CountedWindow* window_ = nullptr;  // owned by file_, or by window_owner_ when not parsed
  std::unique_ptr<ByteSource> window_owner_;
  std::unique_ptr<torchfile::TorchFile> file_;
  const torchfile::TensorInfo* tensor_ = nullptr;  // null when not parsed
  // Where the chunk's bytes lie in the blob.
  struct Layout {
    std::uint64_t data_start = 0;  // blob offset of the first element
    std::uint64_t nbytes = 0;
    bool direct = true;  // row-major contiguous little-endian
  };
  Layout layout_;
  // Transformed items: the .distcp file and the image the blob was parsed from.
  std::shared_ptr<const ByteSource> stored_file_;
  std::unique_ptr<DecompressedItem> decompressed_;
  bool open_pending_ = false;  // a deferred zstd item not opened yet
  bool zip_records_checked_ = false;
  std::optional<DataRecord> zip_data_;  // set by zip_data_record
};

}  // namespace shardpoint::engine
