#include "engine/torch_file_crc.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "core/checksum.h"
#include "shardpoint/error.h"
#include "torchfile/zip_format.h"
#include "torchfile/zip_record_check.h"

namespace shardpoint::engine {
namespace {

std::string tensor_where(const std::string& name, const std::string& fqn) { return name + ": tensor \"" + fqn + "\""; }

}  // namespace

TorchFileCrc::TorchFileCrc(const torchfile::TorchFile& file, std::string name) : file_(file), name_(std::move(name)) {
  for (const auto& [key, range] : file_.storages()) {
    const torchfile::ZipEntry* entry = file_.record("data/" + key);
    if (entry == nullptr || entry->method != torchfile::zip::kMethodStored) continue;
    records_.emplace(key, DataRecord{name_, 0, entry->name, entry->data_offset, entry->uncompressed_size, entry->crc32,
                                     std::string()});
  }
}

void TorchFileCrc::check_small_records() {
  const std::string storage_prefix = file_.archive_name() + "/data/";
  std::vector<std::byte> scratch(std::size_t{64} << 10);
  ZipCrcCounts out;
  for (const torchfile::ZipEntry& entry : file_.archive().entries()) {
    if (entry.name.starts_with(storage_prefix)) continue;
    count_record_check(torchfile::check_zip_record(file_.archive(), entry, true, scratch), entry, 0, name_, out);
  }
  ledger_.count(out);
}

const DataRecord* TorchFileCrc::record_of(const std::string& key) const {
  auto it = records_.find(key);
  return it == records_.end() ? nullptr : &it->second;
}

void TorchFileCrc::add_piece(const std::string& key, const std::string& where, std::uint64_t at, std::uint64_t length,
                             std::uint32_t crc) {
  const DataRecord* base = record_of(key);
  if (base == nullptr) return;  // not a STORED record: nothing to check against
  if (at < base->data_offset || length > base->length || at - base->data_offset > base->length - length) {
    throw FormatError(where + ": bytes [" + std::to_string(at) + ", " + std::to_string(at + length) +
                      ") lie outside its zip record \"" + base->name + "\"");
  }
  DataRecord record = *base;
  record.where = where;
  ledger_.add_piece(record, at - record.data_offset, at - record.data_offset + length, crc);
}

void TorchFileCrc::read(const torchfile::TensorInfo& info, const std::string& fqn, std::uint64_t at,
                        std::span<std::byte> out, std::string_view what) {
  std::uint32_t crc = 0;
  for (std::size_t done = 0; done < out.size();) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kCrcReadBytes, out.size() - done));
    const std::span<std::byte> piece = out.subspan(done, n);
    file_.source().read(at + done, piece, what);
    crc = crc32(crc, piece);
    done += n;
  }
  add_piece(info.storage_key, tensor_where(name_, fqn), at, out.size(), crc);
}

void TorchFileCrc::add_view(const torchfile::TensorInfo& info, const std::string& fqn, std::uint64_t at, ByteSpan bytes,
                            const std::function<void(ByteSpan)>& use) {
  std::uint32_t crc = 0;
  for (std::size_t done = 0; done < bytes.size();) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kCrcReadBytes, bytes.size() - done));
    const ByteSpan piece = bytes.subspan(done, n);
    crc = crc32(crc, piece);
    use(piece);
    done += n;
  }
  add_piece(info.storage_key, tensor_where(name_, fqn), at, bytes.size(), crc);
}

void TorchFileCrc::check_storage(const torchfile::TensorInfo& info, const std::string& fqn) {
  check_storage(info.storage_key, "tensor \"" + fqn + "\"");
}

void TorchFileCrc::check_storage(const std::string& key, const std::string& what) {
  const DataRecord* record = record_of(key);
  if (record == nullptr) return;
  {
    MutexLock lock(mu_);
    if (!whole_.insert(key).second) return;
  }
  const std::string where = name_ + ": " + what;
  const torchfile::ZipEntry* entry = file_.record("data/" + key);
  std::vector<std::byte> scratch(static_cast<std::size_t>(std::clamp<std::uint64_t>(record->length, 1, kCrcReadBytes)));
  const torchfile::RecordCheck check = torchfile::check_zip_record(file_.archive(), *entry, true, scratch);
  if (!check.header_problems.empty()) throw FormatError(where + ": " + check.header_problems.front());
  add_piece(key, where, record->data_offset, record->length, check.found);
}

std::optional<std::string> data_pkl_crc_mismatch(const ByteSource& source, std::uint64_t blob_offset,
                                                 const std::string& where) {
  try {
    const torchfile::ZipArchive archive(source);
    std::vector<std::byte> scratch(std::size_t{64} << 10);
    for (const torchfile::ZipEntry& e : archive.entries()) {
      if (!e.name.ends_with("/data.pkl")) continue;
      const torchfile::RecordCheck c = torchfile::check_zip_record(archive, e, true, scratch);
      if (c.crc != torchfile::RecordCrc::kMismatch) return std::nullopt;
      const std::uint64_t at = blob_offset + e.data_offset;
      return zip_crc_mismatch(where, e.name, at, at + e.compressed_size, c.expected, c.found);
    }
  } catch (const Error&) {
    // The zip structure itself is damaged: the parser's error says so.
  }
  return std::nullopt;
}

std::unique_ptr<torchfile::TorchFile> open_torch_file_naming_crc(
    const std::function<std::unique_ptr<ByteSource>()>& open_source, const std::string& name, bool check_crc) {
  try {
    return torchfile::TorchFile::open(open_source());
  } catch (const Error&) {
    if (!check_crc) throw;
    std::optional<std::string> cause;
    try {
      cause = data_pkl_crc_mismatch(*open_source(), 0, name);
    } catch (const Error&) {
      // The source does not open again: the first error stands.
    }
    if (cause) throw FormatError(*cause);
    throw;
  }
}

}  // namespace shardpoint::engine
