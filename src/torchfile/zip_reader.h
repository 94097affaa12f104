// ZipArchive: the table of contents of a zip archive read from a ByteSource, with each
// record's data located as a byte range of the source (layout: zip_format.h).
//
// Opening parses the end records (classic EOCD found by scanning back at most 64 KiB + 22
// bytes, then the ZIP64 locator and ZIP64 EOCD when present), the central directory, and
// every record's local header (to compute where its data starts: local header offset + 30
// + name length + extra length, which is not in the central directory). The source may be
// a whole file or a window (one blob inside a .distcp file); offsets are relative to the
// source, so an archive must start at the start of its source.
//
// Hostile input: every offset, size and count is checked against the source size before
// it is used or allocated for; a violation is a FormatError naming the source, the record
// and the offset, with expected versus found. Allocation is bounded by the central
// directory size (itself bounded by the source size). CRCs are not verified (PyTorch does
// not either); the data ranges are only located.
//
// Compression: only STORED (method 0) records give access to their data; any other method
// is a FormatError when the data is asked for (torch.save never compresses).
//
// Thread-safety: const methods are safe to call concurrently. The ByteSource must outlive
// the archive.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/byte_stream.h"

namespace shardpoint::torchfile {

// One record of the central directory, with the data offset taken from its local header.
struct ZipEntry {
  std::string name;
  std::uint16_t method = 0;
  std::uint16_t flags = 0;
  std::uint32_t crc32 = 0;
  std::uint64_t compressed_size = 0;
  std::uint64_t uncompressed_size = 0;
  std::uint64_t local_header_offset = 0;
  // First byte of the (stored or compressed) data, relative to the source.
  std::uint64_t data_offset = 0;
};

// [offset, offset + size) of the source.
struct ByteRange {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  bool operator==(const ByteRange&) const = default;
};

class ZipArchive {
 public:
  // Parses the archive in source. Throws FormatError for anything that is not a readable
  // zip archive (message: "<source name>: <record> at offset N: expected X, found Y"),
  // StorageError when the source fails to read.
  explicit ZipArchive(const ByteSource& source);

  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;
  ZipArchive(ZipArchive&&) = default;

  const ByteSource& source() const { return *source_; }
  // Entries in central directory order.
  const std::vector<ZipEntry>& entries() const { return entries_; }
  // The entry named exactly `name`, or nullptr. With duplicate names, the first.
  const ZipEntry* find(std::string_view name) const;
  // True when the archive has ZIP64 end records.
  bool has_zip64_end() const { return zip64_; }

  // Where the entry's data lies in the source. Throws FormatError unless the entry is
  // STORED (compressed_size == uncompressed_size is checked at open for STORED entries).
  ByteRange data_range(const ZipEntry& entry) const;
  // A zero-copy view of the data when the source is in memory (mapped), else nullopt.
  // Throws as data_range().
  std::optional<ByteSpan> view(const ZipEntry& entry) const;
  // The data copied into a new string (size checked against the source first).
  std::string read(const ZipEntry& entry) const;

 private:
  void parse();

  const ByteSource* source_;
  bool zip64_ = false;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, std::size_t> by_name_;
};

// "50 4b 03 04"-style hex of up to the first 4 bytes, for error messages.
std::string hex_bytes(ByteSpan bytes);

}  // namespace shardpoint::torchfile
