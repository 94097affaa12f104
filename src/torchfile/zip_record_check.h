// Checking one record of a zip archive against what the archive says about it: its local
// header and data descriptor agree with its central directory entry, and the CRC-32 of its
// data equals the one the central directory records (layout: zip_format.h).
//
// torch.save (and therefore every .distcp blob) writes each local header with CRC and sizes
// 0 and the data-descriptor flag; the real CRC-32 is in the data descriptor and the central
// directory. ZipArchive only locates records; this is where their bytes are checked.
//
// "No checksum": newer PyTorch can skip the CRC computation
// (torch.serialization.set_crc32_options(False), and records reserved by
// PyTorchFileWriter.write_record_metadata, e.g. under torch.serialization.skip_data); it
// then writes 0 where the CRC-32 goes, in the central directory and the descriptor. A record
// whose central CRC-32 is 0 while its data's CRC-32 is not is therefore kNotRecorded, never
// a mismatch: a stored 0 cannot tell "not computed" from "damaged". (An empty record's
// CRC-32 is 0 and matches.)
//
// Header fields checked: signature, method, flags, name (ZipArchive, at open), the local
// CRC and 32-bit sizes (equal to the central ones, or 0 when the data-descriptor flag is
// set, or 0xFFFFFFFF for zip64 sizes), and the descriptor's CRC and sizes. Not checked:
// version, time/date, the padding extra field's filler bytes.
//
// Thread-safety: pure apart from reads of the archive's source; safe to call concurrently
// on different scratch buffers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "torchfile/zip_reader.h"

namespace shardpoint::torchfile {

enum class RecordCrc {
  kMatch,        // the data's CRC-32 equals the central directory's
  kMismatch,     // it does not: the data (or the recorded CRC) is damaged
  kNotRecorded,  // the writer stored no CRC-32 (0, see above): the data is unchecked
  kNotChecked,   // not computed: a compressed record, or check_crc was false
};

struct RecordCheck {
  RecordCrc crc = RecordCrc::kNotChecked;
  std::uint32_t expected = 0;  // the central directory's CRC-32
  std::uint32_t found = 0;     // the data's (meaningful for kMatch / kMismatch / kNotRecorded)
  ByteRange data;              // where the record's data lies in the archive's source
  // Disagreements of the local header or data descriptor with the central directory,
  // each "<what> at offset N: expected X, found Y" (offsets relative to the source).
  std::vector<std::string> header_problems;
};

// Checks `entry` (one of archive.entries()): its headers always; its data's CRC-32 when
// check_crc and the record is STORED, reading the data in pieces of scratch.size() bytes.
// REQUIRES !scratch.empty(). Throws StorageError when a read fails, FormatError when a
// range lies outside the source (ZipArchive checked the data range at open).
RecordCheck check_zip_record(const ZipArchive& archive, const ZipEntry& entry, bool check_crc,
                             std::span<std::byte> scratch);

// "1a2b3c4d": a CRC-32 as 8 lowercase hex digits, for messages.
std::string crc32_hex(std::uint32_t crc);

}  // namespace shardpoint::torchfile
