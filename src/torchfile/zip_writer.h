// ZipWriter: streams a zip archive laid out exactly as PyTorch's torch.save writes it
// (zip_format.h, docs/dcp-format.md §5.2) to a ByteSink.
//
// Layout choices, all as PyTorch (miniz with MZ_ZIP_FLAG_WRITE_ZIP64 + PyTorch's padding):
//   - every record STORED; flags 0x0808; version/time/date 0;
//   - CRC and sizes are 0 in the local header and follow the data in a data descriptor
//     (16 bytes; 24 with 64-bit sizes for zip64 records), so data streams out without
//     seeking back and without knowing its CRC in advance;
//   - a zip64 extra field (0x0001) in the local header when the record's declared size or
//     its header offset is >= 0xFFFFFFFF; then the FB (0x4246) extra field, always present,
//     padded with 'Z' so the data starts at a multiple of `alignment` from the archive start;
//   - central directory entries with real CRC/sizes and a zip64 extra field for values
//     that do not fit in 32 bits;
//   - always a ZIP64 end of central directory record + locator, then the classic EOCD with
//     the real values where they fit.
// A record begun without a size that turns out >= 4 GiB gets no zip64 local extra (the
// size was unknown when the header went out); its descriptor and central entry are zip64,
// which is what readers (miniz, Python zipfile, ZipArchive) use.
//
// Offsets in the archive are relative to the sink position when the writer was created,
// so an archive can be appended to a sink that already holds other blobs (.distcp).
// Memory: one central-directory entry (name, CRC, sizes, offset) per record; data is
// passed straight to the sink.
//
// Thread-safety: single-writer. Not idempotent: finish() once. A writer dropped before
// finish() leaves an incomplete archive in the sink (the caller discards it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/byte_stream.h"

namespace shardpoint::torchfile {

struct ZipWriterOptions {
  // Every record's data starts at a multiple of this, counted from the archive start.
  // 64 as torch.save (newer PyTorch makes it configurable). 1 disables padding (the FB
  // field is still written). REQUIRES 1 <= alignment <= 32768.
  std::uint32_t alignment = 64;
  // Write zip64 extra fields (sizes and offset) for every record and 0xFFFF... markers in
  // the classic EOCD, as if everything were >= 4 GiB. For tests of the zip64 paths; the
  // output is a valid zip that PyTorch reads.
  bool force_zip64 = false;
};

// What the writer recorded for one finished record (its central directory entry).
struct ZipRecordInfo {
  std::string name;
  std::uint32_t crc32 = 0;
  std::uint64_t size = 0;
  std::uint64_t local_header_offset = 0;  // relative to the archive start
  std::uint64_t data_offset = 0;          // relative to the archive start
  bool zip64_local = false;               // the local header has a zip64 extra field
};

class ZipWriter {
 public:
  // The sink must outlive the writer. Writes nothing yet.
  explicit ZipWriter(ByteSink& sink, ZipWriterOptions options = {});

  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  // Starts a record (writes its local header and padding). `size`, when given, must equal
  // the bytes then written (checked by end_record) and decides the zip64 local extra.
  // Throws UsageError when a record is open, after finish(), for a name longer than
  // 65535 bytes or a duplicate name.
  void begin_record(const std::string& name, std::optional<std::uint64_t> size = std::nullopt);
  // Appends data to the open record (passed straight to the sink; CRC computed on the way).
  // Throws UsageError when no record is open or when more than the declared size is written.
  void write(ByteSpan data);
  // write() through the sink's write_borrowed(): the sink may read data later (byte_stream.h).
  void write_borrowed(ByteSpan data);
  void write(std::string_view data) { write(as_bytes(data)); }
  // Ends the open record (writes its data descriptor). Throws UsageError when no record is
  // open or fewer bytes than the declared size were written.
  void end_record();
  // begin_record(name, data.size()) + write(data) + end_record().
  void write_record(const std::string& name, ByteSpan data);
  void write_record(const std::string& name, std::string_view data) { write_record(name, as_bytes(data)); }

  // Writes the central directory and the end records. Throws UsageError when a record is
  // open or finish() was already called. Does not flush the sink.
  void finish();

  bool finished() const { return finished_; }
  bool record_open() const { return open_.has_value(); }
  // Finished records, in write order.
  const std::vector<ZipRecordInfo>& records() const { return records_; }
  // Bytes written so far by this writer (the archive size after finish()).
  std::uint64_t archive_size() const { return sink_.position() - base_; }

 private:
  void write_record_bytes(ByteSpan data, bool borrowed);

  struct Open {
    ZipRecordInfo info;
    std::optional<std::uint64_t> declared;
    std::uint64_t written = 0;
    std::uint32_t crc = 0;
  };

  ByteSink& sink_;
  ZipWriterOptions options_;
  std::uint64_t base_;
  std::optional<Open> open_;
  std::vector<ZipRecordInfo> records_;
  std::unordered_set<std::string> names_;  // duplicate check
  bool finished_ = false;
};

}  // namespace shardpoint::torchfile
