#include "shardpoint/verify.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <set>

#include "engine/checkpoint_index.h"
#include "engine/checkpoint_location.h"
#include "engine/chunking.h"
#include "engine/compressed_item.h"
#include "engine/item_reader.h"
#include "engine/saved_object.h"
#include "format/checkpoint_path.h"
#include "format/metadata_codec.h"
#include "format/stream_transform.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/reshard.h"
#include "torchfile/torch_file.h"
#include "torchfile/zip_format.h"
#include "torchfile/zip_record_check.h"

namespace shardpoint::engine {
namespace {

// A zstd item verify decompresses is held whole up to this size, else only its records
// (compressed_item.h); it may not decompress past the cap (a decompression bomb).
constexpr std::uint64_t kKeepWholeBytes = std::uint64_t{8} << 20;
constexpr std::uint64_t kMaxDecompressedBytes = std::uint64_t{64} << 30;

// One blob of a .distcp file as a source of its own (offsets relative to the blob), so the
// zip reader sees the archive it is.
class BlobWindow final : public ByteSource {
 public:
  BlobWindow(std::shared_ptr<const ByteSource> file, std::uint64_t base, std::uint64_t length, std::string name)
      : file_(std::move(file)), base_(base), length_(length), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return length_; }
  void read(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const override {
    check_range(offset, out.size(), what);
    file_->read(base_ + offset, out, what);
  }

 private:
  std::shared_ptr<const ByteSource> file_;
  std::uint64_t base_;
  std::uint64_t length_;
  std::string name_;
};

// "[a, b)": a byte range, for messages.
std::string range_text(std::uint64_t begin, std::uint64_t length) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + length) + ")";
}

// How the records of one archive checked out.
struct ArchiveCheck {
  bool clean = true;                // no problem reported
  bool all_crc_matched = true;      // every record's CRC-32 computed and matched
  std::uint64_t stored_bytes = 0;   // data bytes of the STORED records read for their CRC-32
  std::uint64_t matched_bytes = 0;  // of those, the ones whose CRC-32 matched
};

// Checks every record of `archive` (zip_record_check.h) and adds what it finds to `report`
// and `coverage`. `where` prefixes each message (it names the file, and the item when there
// is one); problems carry `file` and `item` (a record's name when `item` is empty).
// `file_base` is the archive's offset in its file, so byte ranges are the file's.
ArchiveCheck check_archive(const torchfile::ZipArchive& archive, const std::string& where, const std::string& file,
                           const std::string& item, std::uint64_t file_base, bool check_crc,
                           std::vector<std::byte>& scratch, VerifyReport& report, VerifyCoverage& coverage) {
  ArchiveCheck out;
  for (const torchfile::ZipEntry& entry : archive.entries()) {
    const std::string record = "zip record \"" + entry.name + "\"";
    const std::string& item_or_record = item.empty() ? entry.name : item;
    torchfile::RecordCheck r;
    try {
      r = torchfile::check_zip_record(archive, entry, check_crc, scratch);
    } catch (const std::exception& e) {
      report.problems.push_back({file, item_or_record, where + ": " + record + ": " + e.what()});
      out.clean = out.all_crc_matched = false;
      continue;
    }
    ++coverage.records;
    coverage.record_bytes += entry.uncompressed_size;
    for (const std::string& p : r.header_problems) {
      report.problems.push_back(
          {file, item_or_record,
           where + (file_base != 0 ? " (blob at byte " + std::to_string(file_base) + " of the file)" : "") + ": " + p});
      out.clean = false;
    }
    if (r.crc != torchfile::RecordCrc::kNotChecked) out.stored_bytes += entry.uncompressed_size;
    switch (r.crc) {
      case torchfile::RecordCrc::kMatch:
        ++coverage.zip_crc32_records;
        coverage.zip_crc32_bytes += entry.uncompressed_size;
        out.matched_bytes += entry.uncompressed_size;
        break;
      case torchfile::RecordCrc::kMismatch:
        report.problems.push_back({file, item_or_record,
                                   where + ": " + record + ", bytes " +
                                       range_text(file_base + r.data.offset, r.data.size) +
                                       " of the file: expected CRC-32 " + torchfile::crc32_hex(r.expected) +
                                       " (central directory), found " + torchfile::crc32_hex(r.found)});
        out.clean = out.all_crc_matched = false;
        break;
      case torchfile::RecordCrc::kNotRecorded:
        ++coverage.no_checksum_records;
        coverage.no_checksum_bytes += entry.uncompressed_size;
        out.all_crc_matched = false;
        break;
      case torchfile::RecordCrc::kNotChecked:  // compressed (torch.save never writes them), or quick
        out.all_crc_matched = false;
        break;
    }
  }
  return out;
}

// A torch.save file (a checkpoint's meta.pt, a consolidated output, a URL's object).
// `label` names it in messages. Adds a coverage entry.
void verify_torch_file(const CheckpointLocation& location, const std::string& label, const VerifyOptions& options,
                       VerifyReport& report) {
  VerifyCoverage& coverage = report.coverage.emplace_back();
  coverage.name = label;
  coverage.quick = options.quick;
  std::unique_ptr<torchfile::TorchFile> file;
  try {
    file = open_torch_file(location);
  } catch (const std::exception& e) {
    // The source names itself in what it throws (a path, or the storage's describe_key,
    // which is what label is for meta.pt): add the label only where it is missing.
    const std::string what = e.what();
    report.problems.push_back({label, "", what.find(label) == std::string::npos ? label + ": " + what : what});
    return;
  }
  coverage.bytes = file->source().size();
  std::vector<std::byte> scratch(std::min<std::size_t>(options.slab_bytes, std::size_t{4} << 20));
  const ArchiveCheck checked =
      check_archive(file->archive(), label, label, "", 0, !options.quick, scratch, report, coverage);
  report.bytes += checked.stored_bytes;
  report.verified_bytes += checked.matched_bytes;
  report.tensors += file->tensors().size();
}

// The load index, when there is one: it must describe this `.metadata` (loads ignore one
// that does not, so it is only dead weight, but a folder should not carry it) and say what
// `.metadata`, the sidecar and the blobs say.
void verify_load_index(storage::Storage& st, const CheckpointReader& reader, VerifyReport& report) {
  const std::string name = st.describe_key(kIndexKey);
  auto problem = [&](std::string item, std::string message) {
    report.problems.push_back({name, std::move(item), std::move(message)});
  };
  CheckpointIndex index;
  try {
    const std::optional<std::string> bytes = st.try_read_all(kIndexKey);
    if (!bytes) return;
    if (!index_matches(*bytes, as_bytes(st.try_read_all(kMetadataKey).value_or(std::string())))) {
      problem("", name + ": does not match .metadata (damaged, or left by another save); loads ignore it, remove it");
      return;
    }
    index = decode_checkpoint_index(*bytes, name);
  } catch (const std::exception& e) {
    problem("", e.what());
    return;
  }
  const format::Metadata& md = reader.metadata();
  if (index.metadata.state_dict_metadata != md.state_dict_metadata || index.metadata.storage_data != md.storage_data ||
      index.metadata.planner_data != md.planner_data) {
    problem("", name + ": its tensors, objects or storage entries differ from .metadata's");
  }
  if ((reader.sidecar() != nullptr) != index.checksums.has_value() ||
      (index.checksums && index.checksums->items() != reader.sidecar()->items())) {
    problem("", name + ": its checksums differ from the sidecar's");
  }
  SourceCache sources(st);
  for (const auto& entry : index.data_offsets) {
    // Not a structured binding: clang 14 cannot capture one in the lambda below.
    const format::MetadataIndex& key = entry.first;
    const std::uint64_t start = entry.second;
    try {
      const auto& info = md.storage_data.at(key);
      const auto& tensor = std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at(key.fqn));
      const auto chunk = std::find_if(tensor.chunks.begin(), tensor.chunks.end(),
                                      [&](const auto& c) { return key.offset && c.offsets == *key.offset; });
      if (chunk == tensor.chunks.end()) throw FormatError("no such chunk in .metadata");
      std::optional<SavedTensorBlob> blob;
      try {
        blob.emplace(sources.get(info.relative_path), info, key.fqn, *chunk, tensor.properties.dtype);
      } catch (const Error&) {
        continue;  // a damaged or missing blob: the item checks report it, once
      }
      if (blob->data_start() != start) {
        problem(key.fqn, name + ": item \"" + key.fqn + "\": data starts at " + std::to_string(blob->data_start()) +
                             " of its blob, the index says " + std::to_string(start));
      }
    } catch (const std::exception& e) {
      problem(key.fqn, name + ": item \"" + key.fqn + "\": " + e.what());
    }
  }
}

// Checking the items of one DCP checkpoint: what the item loop shares.
class DcpVerifier {
 public:
  DcpVerifier(storage::Storage& st, CheckpointReader& reader, const VerifyOptions& options, VerifyReport& report,
              VerifyCoverage& coverage)
      : reader_(reader),
        options_(options),
        report_(report),
        coverage_(coverage),
        sources_(st),
        slab_(),
        scratch_(std::min<std::size_t>(options.slab_bytes, std::size_t{4} << 20)) {}

  void tensor(const std::string& fqn, const format::TensorStorageMetadata& t) {
    const std::size_t itemsize = dtype_itemsize(t.properties.dtype);
    bool clean = true;
    for (const auto& chunk : t.chunks) {
      const format::StorageInfo* info = storage_info(fqn, chunk.offsets);
      const std::string chunk_text = " chunk " + format::describe_chunk(chunk);
      const std::string item = fqn + chunk_text;
      const std::string file = info ? info->relative_path : std::string();
      std::uint64_t chunk_bytes = 0;
      try {
        if (options_.quick) {
          if (info == nullptr) throw FormatError("no storage entry in .metadata");  // check_metadata says so too
          SavedTensorBlob blob(sources_.get(info->relative_path), *info, fqn, chunk, t.properties.dtype,
                               reader_.raw_tensor_items() ? std::optional<std::uint64_t>(0) : std::nullopt);
        } else {
          for_each_box(chunk.sizes, itemsize, options_.slab_bytes,
                       [&](const format::Shape& off, const format::Shape& sizes, std::uint64_t n) {
                         format::Shape global(off);
                         for (std::size_t d = 0; d < global.size(); ++d) global[d] += chunk.offsets[d];
                         slab_.resize(static_cast<std::size_t>(n));
                         reader_.read_box(fqn, global, sizes, slab_);
                         chunk_bytes += n;
                       });
        }
      } catch (const std::exception& e) {
        item_failed(file, item, fqn, e.what());
        clean = false;
        continue;
      }
      report_.bytes += chunk_bytes;
      if (info == nullptr) continue;  // not reached: the read needs the storage entry
      const bool in_sidecar = sidecar_entry(info) != nullptr;
      if (in_sidecar) coverage_.sidecar_bytes += chunk_bytes;
      if (reader_.raw_tensor_items()) {
        // Safetensors: no checksum; its header was checked when the reader opened it.
        coverage_.bytes += info->length;
        continue;
      }
      const ArchiveCheck blob = check_blob(*info, fqn, chunk_text);
      clean &= blob.clean;
      if (blob.clean && (in_sidecar || blob.all_crc_matched)) report_.verified_bytes += chunk_bytes;
    }
    if (clean) ++report_.tensors;
  }

  void object(const std::string& fqn) {
    const format::StorageInfo* info = storage_info(fqn, std::nullopt);
    const std::string file = info ? info->relative_path : std::string();
    try {
      if (options_.quick) {
        if (info == nullptr) throw FormatError("no storage entry in .metadata");
        ReadCounts counts;
        read_saved_object(sources_.get(info->relative_path), *info, fqn, BlobChecksums{}, counts);
      } else {
        reader_.read_object(fqn);
      }
    } catch (const std::exception& e) {
      item_failed(file, fqn, fqn, e.what());
      return;
    }
    if (info == nullptr) return;  // not reached: the read needs the storage entry
    if (sidecar_entry(info) != nullptr) coverage_.sidecar_bytes += info->length;
    if (check_blob(*info, fqn, "").clean) ++report_.objects;
  }

 private:
  // The item's message as the load path wrote it, prefixed with the item when it does not
  // name it.
  void item_failed(const std::string& file, const std::string& item, const std::string& fqn, const std::string& what) {
    report_.problems.push_back(
        {file, item, what.find(fqn) == std::string::npos ? "item \"" + fqn + "\": " + what : what});
  }

  const format::StorageInfo* storage_info(const std::string& fqn, const std::optional<format::Shape>& offsets) const {
    auto it = reader_.metadata().storage_data.find(format::MetadataIndex{fqn, offsets, std::nullopt});
    return it == reader_.metadata().storage_data.end() ? nullptr : &it->second;
  }

  const ItemChecksums* sidecar_entry(const format::StorageInfo* info) const {
    if (options_.quick || info == nullptr || !reader_.sidecar() ||
        reader_.sidecar()->algorithm() == ChecksumAlgorithm::kNone) {
      return nullptr;
    }
    return reader_.sidecar()->find(info->relative_path, info->offset);
  }

  // The blob's records: headers always, CRC-32s unless quick.
  // `chunk_text`: " chunk [..]" for a tensor chunk, empty for an object.
  ArchiveCheck check_blob(const format::StorageInfo& info, const std::string& fqn, const std::string& chunk_text) {
    const std::string item = fqn + chunk_text;
    const std::string where = info.relative_path + ": item \"" + fqn + "\"" + chunk_text;
    coverage_.bytes += info.length;
    if (!info.transform_descriptors.empty()) return check_decompressed_blob(info, item, where);
    try {
      BlobWindow window(
          sources_.get(info.relative_path), info.offset, info.length,
          info.relative_path + "[" + std::to_string(info.offset) + "+" + std::to_string(info.length) + "]");
      torchfile::ZipArchive archive(window);
      return check_archive(archive, where, info.relative_path, item, info.offset, !options_.quick, scratch_, report_,
                           coverage_);
    } catch (const std::exception& e) {
      report_.problems.push_back({info.relative_path, item, where + ": " + e.what()});
      return {false, false};
    }
  }

  // check_blob of a zstd item (docs/dcp-format.md §2.4): the records of the blob it
  // decompresses to; a record in the image's hole is checked by its CRC-32 taken in passing.
  ArchiveCheck check_decompressed_blob(const format::StorageInfo& info, const std::string& item,
                                       const std::string& where) {
    try {
      format::parse_transforms(info.transform_descriptors, where);
      DecompressOptions options;
      options.max_bytes = kMaxDecompressedBytes;
      options.keep_whole_bytes = kKeepWholeBytes;
      const DecompressedItem image = decompress_item(sources_.get(info.relative_path), info,
                                                     where + " (" + info.transform_descriptors.front() + ")", options);
      check_ends_with_zip_end(image, where + " (" + info.transform_descriptors.front() + ")");
      const torchfile::ZipArchive archive(*image.image);
      const std::string inside = where + " (decompressed)";
      ArchiveCheck out = check_archive(archive, inside, info.relative_path, item, 0, !options_.quick && !image.hole,
                                       scratch_, report_, coverage_);
      if (options_.quick || !image.hole) return out;
      out.all_crc_matched = true;
      for (const torchfile::ZipEntry& entry : archive.entries()) {
        if (entry.method != torchfile::zip::kMethodStored) continue;
        const torchfile::ByteRange data = archive.data_range(entry);
        const std::optional<std::uint32_t> found = decompressed_crc32(image, data.offset, data.offset + data.size);
        if (!found) {
          report_.problems.push_back({info.relative_path, item,
                                      inside + ": zip record \"" + entry.name + "\": holds part of the tensor data"});
          out.clean = out.all_crc_matched = false;
        } else if (*found != entry.crc32) {
          report_.problems.push_back({info.relative_path, item,
                                      inside + ": zip record \"" + entry.name + "\", bytes " +
                                          range_text(data.offset, data.size) + ": expected CRC-32 " +
                                          torchfile::crc32_hex(entry.crc32) + " (central directory), found " +
                                          torchfile::crc32_hex(*found)});
          out.clean = out.all_crc_matched = false;
        } else {
          ++coverage_.zip_crc32_records;
          coverage_.zip_crc32_bytes += data.size;
          out.matched_bytes += data.size;
        }
        out.stored_bytes += data.size;
      }
      return out;
    } catch (const std::exception& e) {
      report_.problems.push_back({info.relative_path, item, where + ": " + e.what()});
      return {false, false};
    }
  }

  CheckpointReader& reader_;
  const VerifyOptions& options_;
  VerifyReport& report_;
  VerifyCoverage& coverage_;
  SourceCache sources_;
  std::vector<std::byte> slab_;     // tensor data through the load path
  std::vector<std::byte> scratch_;  // zip record data for the CRC-32
};

}  // namespace

VerifyReport verify_dcp(const std::shared_ptr<storage::Storage>& st, const std::optional<std::string>& local_folder,
                        const std::string& name, const VerifyOptions& options) {
  if (options.slab_bytes == 0) throw UsageError("verify: slab_bytes must be > 0");
  const CheckpointKind kind = folder_kind(*st);
  VerifyReport report;
  report.name = name;
  report.kind = kind;
  report.quick = options.quick;
  report.coverage.emplace_back();
  report.coverage.back().name = name;
  report.coverage.back().kind = kind;
  report.coverage.back().quick = options.quick;

  std::unique_ptr<CheckpointReader> reader;
  try {
    // verify checks and reports every record's CRC-32 itself (all problems, not the first).
    reader = std::make_unique<CheckpointReader>(*st, CheckpointReaderOptions{.check_zip_crc = false});
  } catch (const std::exception& e) {
    report.problems.push_back({st->describe_key(kMetadataKey), "", e.what()});
    return report;
  }
  if (reader->sidecar() && !options.quick) {
    report.coverage.back().sidecar = reader->sidecar()->algorithm();
    report.coverage.back().sidecar_block_size = reader->sidecar()->block_size();
  }
  const format::Metadata& md = reader->metadata();
  for (const std::string& p : format::check_metadata(md)) {
    report.problems.push_back({st->describe_key(kMetadataKey), "", st->describe_key(kMetadataKey) + ": " + p});
  }
  verify_load_index(*st, *reader, report);

  // Files: present, long enough for every item; items with a bad file are not read.
  std::map<std::string, std::optional<std::uint64_t>> sizes;
  std::set<std::string> bad_items;  // fqn
  for (const auto& [index, info] : md.storage_data) {
    if (!format::is_safe_relative_path(info.relative_path)) {
      bad_items.insert(index.fqn);
      continue;  // check_metadata reported it
    }
    try {
      if (local_folder) format::resolve_item_path(*local_folder, info.relative_path);
    } catch (const std::exception& e) {
      report.problems.push_back({info.relative_path, index.fqn, e.what()});
      bad_items.insert(index.fqn);
      continue;
    }
    auto it = sizes.find(info.relative_path);
    if (it == sizes.end()) {
      it = sizes.emplace(info.relative_path, st->try_stat(info.relative_path)).first;
      if (!it->second) {
        report.problems.push_back(
            {info.relative_path, "", st->describe_key(info.relative_path) + ": missing (referenced by .metadata)"});
      }
    }
    if (!it->second) {
      bad_items.insert(index.fqn);
    } else if (info.offset + info.length > *it->second) {
      report.problems.push_back({info.relative_path, index.fqn,
                                 st->describe_key(info.relative_path) + ": item \"" + index.fqn + "\" needs " +
                                     std::to_string(info.offset + info.length) + " bytes, file has " +
                                     std::to_string(*it->second) + " (truncated)"});
      bad_items.insert(index.fqn);
    }
  }

  DcpVerifier items(*st, *reader, options, report, report.coverage.back());
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    if (bad_items.count(fqn)) continue;
    if (const auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) {
      if (!format::check_chunk_tiling(*t).empty()) continue;  // reported above
      items.tensor(fqn, *t);
    } else {
      items.object(fqn);
    }
  }

  if (st->try_stat("meta.pt")) {
    CheckpointLocation meta;
    meta.name = st->describe_key("meta.pt");
    if (local_folder) {
      meta.local_file = *local_folder + "/meta.pt";
    } else {
      meta.storage = st;
      meta.key = "meta.pt";
    }
    const std::uint64_t tensors = report.tensors;
    verify_torch_file(meta, local_folder ? meta.local_file : meta.name, options, report);
    report.tensors = tensors;  // meta.pt counts as one object
    report.objects += 1;
  }
  return report;
}

VerifyReport verify(const std::string& path_or_url, const VerifyOptions& options) {
  return verify(Location::parse(path_or_url), options);
}

VerifyReport verify(const Location& where, const VerifyOptions& options) {
  if (options.slab_bytes == 0) throw UsageError("verify: slab_bytes must be > 0");
  const std::string& path_or_url = where.text();
  std::optional<std::string> local;  // the path on the local filesystem, file:// stripped
  if (!where.is_remote()) {
    local = where.path();
    struct stat st {};
    if (::stat(local->c_str(), &st) != 0) {
      throw StorageError(StorageError::Kind::kNotFound, "\"" + path_or_url + "\": no such file or folder");
    }
  }
  CheckpointLocation location = locate_checkpoint(where);
  if (location.is_folder()) return verify_dcp(location.storage, local, path_or_url, options);
  VerifyReport report;
  report.name = path_or_url;
  report.quick = options.quick;
  verify_torch_file(location, path_or_url, options, report);
  return report;
}

}  // namespace shardpoint::engine
