#include "engine/zip_crc_ledger.h"

#include <array>
#include <iterator>

#include "core/checksum.h"
#include "shardpoint/error.h"
#include "torchfile/zip_record_check.h"

namespace shardpoint::engine {

std::string zip_crc_mismatch(const std::string& where, const std::string& record, std::uint64_t file_begin,
                             std::uint64_t file_end, std::uint32_t expected, std::uint32_t found) {
  return where + ": zip record \"" + record + "\" (file bytes [" + std::to_string(file_begin) + ", " +
         std::to_string(file_end) + ")): CRC-32 mismatch: expected " + torchfile::crc32_hex(expected) +
         " (central directory), found " + torchfile::crc32_hex(found);
}

void ZipCrcLedger::add_piece(const DataRecord& record, std::uint64_t begin, std::uint64_t end, std::uint32_t crc) {
  if (begin >= end) return;
  MutexLock lock(mu_);
  auto [it, fresh] = records_.try_emplace({record.file, record.blob_offset + record.data_offset});
  Pieces& p = it->second;
  if (fresh) p.record = record;
  if (p.done) return;
  if (begin == 0 && end == p.record.length) {
    // The whole record in one piece checks it, whatever pieces came before.
    finish(p, crc);
    return;
  }
  auto& runs = p.runs;
  auto next = runs.lower_bound(begin);
  // Overlaps (the same bytes read twice) cannot be combined: leave the record unchecked.
  if (next != runs.end() && next->first < end) return;
  if (next != runs.begin() && std::prev(next)->second.first > begin) return;
  // Join the run that ends where this piece begins, then the one that begins where it ends.
  std::uint64_t run_begin = begin;
  std::uint64_t run_end = end;
  std::uint32_t run_crc = crc;
  if (next != runs.begin() && std::prev(next)->second.first == begin) {
    auto before = std::prev(next);
    run_begin = before->first;
    run_crc = crc32_combine(before->second.second, crc, end - begin);
    runs.erase(before);
  }
  if (next != runs.end() && next->first == end) {
    run_crc = crc32_combine(run_crc, next->second.second, next->second.first - next->first);
    run_end = next->second.first;
    runs.erase(next);
  }
  if (run_begin != 0 || run_end != p.record.length) {
    runs.emplace(run_begin, std::make_pair(run_end, run_crc));
    return;
  }
  finish(p, run_crc);
}

void ZipCrcLedger::finish(Pieces& p, std::uint32_t crc) {
  p.done = true;
  p.runs.clear();
  const DataRecord& r = p.record;
  if (crc == r.expected) {
    ++whole_.records_checked;
    whole_.bytes_checked += r.length;
  } else if (r.expected == 0) {
    ++whole_.records_no_checksum;
  } else {
    const std::uint64_t at = r.blob_offset + r.data_offset;
    throw FormatError(zip_crc_mismatch(r.where, r.name, at, at + r.length, r.expected, crc));
  }
}

bool ZipCrcLedger::claim_blob(const std::string& file, std::uint64_t blob_offset) {
  MutexLock lock(mu_);
  return claimed_.emplace(file, blob_offset).second;
}

void ZipCrcLedger::count(const ZipCrcCounts& whole) {
  MutexLock lock(mu_);
  whole_ += whole;
}

ZipCrcCounts ZipCrcLedger::counts() const {
  MutexLock lock(mu_);
  ZipCrcCounts out = whole_;
  for (const auto& [key, p] : records_) {
    if (!p.done) ++out.records_partial;
  }
  return out;
}

void count_record_check(const torchfile::RecordCheck& check, const torchfile::ZipEntry& entry,
                        std::uint64_t blob_offset, const std::string& where, ZipCrcCounts& out) {
  if (!check.header_problems.empty()) throw FormatError(where + ": " + check.header_problems.front());
  switch (check.crc) {
    case torchfile::RecordCrc::kMatch:
      ++out.records_checked;
      out.bytes_checked += entry.uncompressed_size;
      break;
    case torchfile::RecordCrc::kMismatch: {
      const std::uint64_t at = blob_offset + entry.data_offset;
      throw FormatError(
          zip_crc_mismatch(where, entry.name, at, at + entry.compressed_size, check.expected, check.found));
    }
    case torchfile::RecordCrc::kNotRecorded: ++out.records_no_checksum; break;
    case torchfile::RecordCrc::kNotChecked: break;  // a record checked in part, or a compressed one
  }
}

ZipCrcCounts check_records_but(const torchfile::ZipArchive& archive, const std::string& skip, std::uint64_t blob_offset,
                               const std::string& where) {
  // Reads of at most this size are served from the blob ends CountedWindow holds.
  std::array<std::byte, 1024> scratch{};
  ZipCrcCounts out;
  for (const torchfile::ZipEntry& entry : archive.entries()) {
    count_record_check(torchfile::check_zip_record(archive, entry, entry.name != skip, scratch), entry, blob_offset,
                       where, out);
  }
  return out;
}

}  // namespace shardpoint::engine
