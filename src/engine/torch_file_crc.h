// TorchFileCrc: the zip CRC-32 checks of what is read from one torch.save file (a reshard
// source, an `inspect --hash` listing, consolidate's meta.pt): the central directory of the
// zip records each record's CRC-32 (torchfile/zip_record_check.h).
//
// The small records (data.pkl, version, byteorder, ...) are read whole when the file is
// opened and are checked whole (check_small_records). A storage record data/<key> is read
// by the tensors that view it, in any order and in parts, so each read adds a piece (its
// range and CRC-32, computed right after the read while the bytes are in cache) to a
// ZipCrcLedger, which checks the record once the pieces cover it. A tensor whose bytes do
// not lie in storage order (strided, e.g. a transposed view) has its storage record read
// and checked whole once instead (check_storage): the reads of such a tensor are element
// runs, too many and too small to check one by one. A record covered only in part (a view
// of part of its storage) stays unchecked and counts as records_partial. A record written
// without a CRC-32 counts as records_no_checksum, never as an error.
//
// Mismatch: FormatError "<name>: tensor \"fqn\": zip record \"archive/data/3\" (file bytes
// [a, b)): CRC-32 mismatch: expected X (central directory), found Y" (zip_crc_mismatch),
// or, for a small record, "<name>: zip record \"archive/data.pkl\" (...)".
//
// Thread-safety: after construction, every method may be called from several threads at
// once. The TorchFile must outlive the TorchFileCrc.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "core/byte_stream.h"
#include "engine/zip_crc_ledger.h"
#include "shardpoint/mutex.h"
#include "shardpoint/zip_crc_counts.h"
#include "torchfile/torch_file.h"

namespace shardpoint::engine {

// Checked reads go through this many bytes at a time: each piece's CRC-32 is computed right
// after it is read, while it is still in the core's cache.
inline constexpr std::uint64_t kCrcReadBytes = std::uint64_t{256} << 10;

class TorchFileCrc {
 public:
  // `name` names the file in messages (the path or URL as the user gave it).
  TorchFileCrc(const torchfile::TorchFile& file, std::string name);

  TorchFileCrc(const TorchFileCrc&) = delete;
  TorchFileCrc& operator=(const TorchFileCrc&) = delete;

  // Checks every record that is not a storage record, headers (against the central
  // directory) and CRC-32, reading them through the file's source. Throws FormatError
  // "<name>: ..." on the first problem. Call once, right after the file is opened.
  void check_small_records();

  // Reads [at, at + out.size()) of the source into `out` as stored (no byte swap), in
  // pieces of at most kCrcReadBytes, and adds the range as a piece of the storage record
  // of `info`, the tensor `fqn`. REQUIRES info.is_contiguous() (else use check_storage)
  // and the range inside info.storage. Throws FormatError on a mismatch (when this piece
  // completes the record), what the source's read throws.
  void read(const torchfile::TensorInfo& info, const std::string& fqn, std::uint64_t at, std::span<std::byte> out,
            std::string_view what);
  // Adds bytes already in memory (a mapped view of the source at `at`) as read() adds the
  // ones it reads: CRC-32 in pieces of kCrcReadBytes, each handed to `use` right after.
  void add_view(const torchfile::TensorInfo& info, const std::string& fqn, std::uint64_t at, ByteSpan bytes,
                const std::function<void(ByteSpan)>& use);

  // Reads the storage record of `info` whole and checks it, once per record (later calls
  // return at once). Throws FormatError on a mismatch or a header that disagrees with the
  // central directory.
  void check_storage(const torchfile::TensorInfo& info, const std::string& fqn);
  // The same for storage `key` of an object that holds tensors (`what`: "object \"fqn\"").
  void check_storage(const std::string& key, const std::string& what);

  // What was checked so far.
  ZipCrcCounts counts() const { return ledger_.counts(); }

 private:
  const DataRecord* record_of(const std::string& key) const;
  void add_piece(const std::string& key, const std::string& where, std::uint64_t at, std::uint64_t length,
                 std::uint32_t crc);

  const torchfile::TorchFile& file_;
  std::string name_;
  std::map<std::string, DataRecord> records_;  // storage key -> its record (STORED ones)
  ZipCrcLedger ledger_;
  Mutex mu_;
  std::set<std::string> whole_ SP_GUARDED_BY(mu_);  // storage keys check_storage has taken
};

// The zip CRC-32 mismatch of the data.pkl record of the torch.save archive in `source`, as
// zip_crc_mismatch words it (`where`; byte range offset by `blob_offset`, where the archive
// starts in its file), or nullopt when it matches, has no CRC-32, or the zip structure
// itself cannot be read (the parser's own error says that). Names the cause when a damaged
// data.pkl does not parse.
std::optional<std::string> data_pkl_crc_mismatch(const ByteSource& source, std::uint64_t blob_offset,
                                                 const std::string& where);

// Opens the torch.save file `open_source()` returns. When that fails with an Error (a
// damaged data.pkl often does not parse) and `check_crc`, opens the source once more and,
// when its data.pkl's CRC-32 mismatches, throws that mismatch (FormatError "<name>: zip
// record ...: CRC-32 mismatch ...") as the cause instead; otherwise rethrows.
std::unique_ptr<torchfile::TorchFile> open_torch_file_naming_crc(
    const std::function<std::unique_ptr<ByteSource>()>& open_source, const std::string& name, bool check_crc);

}  // namespace shardpoint::engine
