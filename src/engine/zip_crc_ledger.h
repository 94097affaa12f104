// The zip CRC-32 checks of a read pass over blobs that no checksum sidecar covers
// (checkpoints PyTorch wrote; docs/dcp-format.md §5.2). Every .distcp blob is a torch.save
// zip whose central directory records the CRC-32 of each record.
//
// A tensor blob's small records (data.pkl, byteorder, version, serialization id) are read
// whole when the blob is opened and checked then (check_records_but). Its data record is
// read by load items and consolidate slabs in any order and in parts, so each read adds a
// piece (its range and CRC-32, computed right after the read while the bytes are in cache)
// to a ZipCrcLedger, which checks the record once its pieces cover it (crc32_combine).
// A record whose pieces never cover it (a resharding load that needs only part of a chunk)
// cannot be checked; counts().records_partial says how many, so callers say it once.
// A record written without a CRC-32 (0 in the central directory, zip_record_check.h) is
// "no checksum": counted, never an error. A single torch.save file (a reshard source, an
// inspect --hash listing, consolidate's meta.pt) is checked the same way through
// torch_file_crc.h, one ledger record per storage record.
//
// Thread-safety: ZipCrcLedger's methods may be called from several threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "shardpoint/mutex.h"
#include "shardpoint/zip_crc_counts.h"
#include "torchfile/zip_reader.h"
#include "torchfile/zip_record_check.h"

namespace shardpoint::engine {

// One record read in pieces, as a ledger tracks it: the data record of a tensor blob, or a
// storage record of a torch.save file (torch_file_crc.h; blob_offset 0). A record is known
// by its file and where its data starts in it (blob_offset + data_offset).
struct DataRecord {
  std::string file;               // the .distcp file (relative path), or the torch.save file
  std::uint64_t blob_offset = 0;  // where the blob starts in it (0: the whole file)
  std::string name;               // "archive/data/0"
  std::uint64_t data_offset = 0;  // blob-relative start of the record's data
  std::uint64_t length = 0;       // its data bytes
  std::uint32_t expected = 0;     // the central directory's CRC-32
  std::string where;              // "<file>: item \"fqn\" chunk [..]" or "<file>: tensor \"fqn\"", for errors
};

// "<where>: zip record \"name\" (file bytes [a, b)): CRC-32 mismatch: expected X (central
// directory), found Y": the message of every zip CRC-32 mismatch of a read.
std::string zip_crc_mismatch(const std::string& where, const std::string& record, std::uint64_t file_begin,
                             std::uint64_t file_end, std::uint32_t expected, std::uint32_t found);

class ZipCrcLedger {
 public:
  // Adds the piece [begin, end) (relative to the record's data) of `record` with its
  // CRC-32. When the pieces then cover the record, checks it: throws FormatError
  // (zip_crc_mismatch) when the combined CRC-32 differs from record.expected and that is
  // not 0. A piece overlapping one already added is dropped (it cannot be combined), unless
  // it is the whole record, which checks the record by itself.
  void add_piece(const DataRecord& record, std::uint64_t begin, std::uint64_t end, std::uint32_t crc);
  // True on the first call for the blob (file, blob_offset), false after: its small
  // records are checked (check_records_but) once per ledger however often it is opened
  // (consolidate opens a blob once per slab).
  bool claim_blob(const std::string& file, std::uint64_t blob_offset);
  // Adds the counts of records checked whole elsewhere (check_records_but).
  void count(const ZipCrcCounts& whole);
  // What was checked so far; records_partial counts records with pieces not yet covering them.
  ZipCrcCounts counts() const;

 private:
  struct Pieces {
    DataRecord record;
    std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> runs;  // begin -> (end, crc)
    bool done = false;
  };
  // Checks p's record against crc, its data's CRC-32; marks it done.
  void finish(Pieces& p, std::uint32_t crc) SP_REQUIRES(mu_);
  mutable Mutex mu_;
  // (file, blob + data offset) -> the pieces seen
  std::map<std::pair<std::string, std::uint64_t>, Pieces> records_ SP_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::uint64_t>> claimed_ SP_GUARDED_BY(mu_);
  ZipCrcCounts whole_ SP_GUARDED_BY(mu_);
};

// Adds what check_zip_record found for `entry` to `out` (checked, or written without a
// CRC-32). Throws FormatError "<where>: <problem>" for a header that disagrees with the
// central directory or a CRC-32 mismatch (its byte range offset by blob_offset).
void count_record_check(const torchfile::RecordCheck& check, const torchfile::ZipEntry& entry,
                        std::uint64_t blob_offset, const std::string& where, ZipCrcCounts& out);

// Checks every record of `archive` (one blob, whose source starts at file offset
// blob_offset) except the one named `skip` (the data record read in pieces; "" skips
// none): its local header and data descriptor against the central directory and the
// CRC-32 of its data (read through the archive's source, which for an opened blob holds
// these bytes already). The skipped record's headers are checked too. Throws FormatError
// "<where>: <problem>" on the first mismatch. Returns what it checked.
ZipCrcCounts check_records_but(const torchfile::ZipArchive& archive, const std::string& skip, std::uint64_t blob_offset,
                               const std::string& where);

}  // namespace shardpoint::engine
