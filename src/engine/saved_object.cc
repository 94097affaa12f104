#include "engine/saved_object.h"

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "engine/block_checksum.h"
#include "engine/compressed_item.h"
#include "engine/zip_crc_ledger.h"
#include "format/stream_transform.h"
#include "shardpoint/error.h"
#include "torchfile/zip_reader.h"

namespace shardpoint::engine {

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

namespace {

// The largest object a zstd bytes item may decompress to: it is held whole in memory.
constexpr std::uint64_t kMaxObjectBytes = std::uint64_t{4} << 30;

void check_item_checksum(const std::string& where, const format::StorageInfo& info, const BlobChecksums& checksums,
                         std::uint64_t found) {
  if (checksums.item->length != info.length) {
    throw FormatError(where + ": checksum sidecar says the blob has " + std::to_string(checksums.item->length) +
                      " bytes, .metadata says " + std::to_string(info.length));
  }
  if (found != checksums.item->checksum) {
    throw FormatError(where + ": checksum mismatch: expected " +
                      std::string(checksum_algorithm_name(checksums.algorithm)) + " " +
                      checksum_to_hex(checksums.algorithm, checksums.item->checksum) + ", found " +
                      checksum_to_hex(checksums.algorithm, found));
  }
}

}  // namespace

std::unique_ptr<ByteSource> read_item_blob(const std::shared_ptr<const ByteSource>& file,
                                           const format::StorageInfo& info, const std::string& where,
                                           const BlobChecksums& checksums, ReadCounts& counts) {
  const format::StreamTransform transform = format::parse_transforms(info.transform_descriptors, where);
  if (info.offset > file->size() || info.length > file->size() - info.offset) {
    throw FormatError(where + ": blob [" + std::to_string(info.offset) + ", " +
                      std::to_string(info.offset + info.length) + ") reaches past the end of the file (" +
                      std::to_string(file->size()) + " bytes)");
  }
  const bool verify = checksums.item != nullptr && checksums.algorithm != ChecksumAlgorithm::kNone;
  const std::string name =
      info.relative_path + "[" + std::to_string(info.offset) + "+" + std::to_string(info.length) + "]";
  counts.data_bytes += info.length;
  if (transform != format::StreamTransform::kNone) {
    StreamingChecksum sum(verify ? checksums.algorithm : ChecksumAlgorithm::kNone);
    DecompressOptions options;
    options.max_bytes = kMaxObjectBytes;
    options.keep_whole_bytes = kMaxObjectBytes;
    if (verify) options.on_stored = [&](std::uint64_t, ByteSpan bytes) { sum.update(bytes); };
    DecompressedItem item =
        decompress_item(file, info, where + " (" + info.transform_descriptors.front() + ")", options);
    if (verify) check_item_checksum(where, info, checksums, sum.value());
    check_ends_with_zip_end(item, where + " (" + info.transform_descriptors.front() + ")");
    return owning_source(std::move(item.image));
  }
  std::vector<std::byte> blob(static_cast<std::size_t>(info.length));
  file->read(info.offset, blob, where);
  if (verify) check_item_checksum(where, info, checksums, checksum_of(checksums.algorithm, blob));
  return std::make_unique<OwnedSource>(std::move(blob), name);
}

std::unique_ptr<torchfile::TorchFile> open_saved_object(const std::shared_ptr<const ByteSource>& file,
                                                        const format::StorageInfo& info, const std::string& fqn,
                                                        const BlobChecksums& checksums, ReadCounts& counts) {
  const std::string where = info.relative_path + ": item \"" + fqn + "\"";
  std::unique_ptr<ByteSource> source = read_item_blob(file, info, where, checksums, counts);
  if (checksums.item == nullptr && checksums.zip_crc != nullptr) {
    // Before the pickle is parsed, so a damaged data.pkl is named as a CRC-32 mismatch.
    std::optional<torchfile::ZipArchive> archive;
    try {
      archive.emplace(*source);
    } catch (const Error&) {
      rethrow_with_context(where);
    }
    checksums.zip_crc->count(check_records_but(*archive, "", info.offset, where));
  }
  std::unique_ptr<torchfile::TorchFile> torch_file;
  try {
    torch_file = torchfile::TorchFile::open(std::move(source));
  } catch (const Error&) {
    rethrow_with_context(where);
  }
  return torch_file;
}

pickle::ValuePtr read_saved_object(const std::shared_ptr<const ByteSource>& file, const format::StorageInfo& info,
                                   const std::string& fqn, const BlobChecksums& checksums, ReadCounts& counts) {
  return open_saved_object(file, info, fqn, checksums, counts)->root();
}

}  // namespace shardpoint::engine
