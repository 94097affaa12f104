#include "engine/planned_io.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "engine/block_checksum.h"
#include "engine/checkpoint_index.h"
#include "engine/folder_metadata.h"
#include "engine/item_reader.h"
#include "engine/load_plan.h"
#include "engine/metadata_files.h"
#include "engine/parallel_for.h"
#include "engine/read_ahead.h"
#include "engine/safetensors_metadata.h"
#include "engine/save_steps.h"
#include "engine/saved_object.h"
#include "engine/zip_crc_ledger.h"
#include "format/metadata_codec.h"
#include "shardpoint/error.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/zip_reader.h"

namespace shardpoint::engine {

std::vector<WrittenItem> write_planned_files(storage::Storage& checkpoint, const std::vector<PlannedFile>& files,
                                             const SaveOptions& options) {
  // write_item() takes a planned WriteItem and the leaf it is written from; build both.
  std::vector<std::vector<WriteItem>> items(files.size());
  std::vector<std::vector<FlatValue>> values(files.size());
  std::vector<save_steps::FileToWrite> to_write(files.size());
  for (std::size_t f = 0; f < files.size(); ++f) {
    items[f].reserve(files[f].items.size());
    values[f].reserve(files[f].items.size());
    to_write[f].name = files[f].name;
    for (const PlannedItem& planned : files[f].items) {
      WriteItem& item = items[f].emplace_back();
      item.index = planned.index;
      item.type = planned.type;
      item.file = files[f].name;
      if (planned.type == WriteItemType::kTensor) {
        const Shape offsets = planned.index.offset.value_or(Shape(planned.sizes.size(), 0));
        if (offsets.size() != planned.sizes.size()) {
          throw UsageError("save: item \"" + planned.index.fqn + "\": chunk offsets and sizes differ in rank");
        }
        item.dtype = planned.dtype;
        item.chunk = format::ChunkStorageMetadata{offsets, planned.sizes};
        item.nbytes = planned.bytes.size();
        TensorShard shard;
        shard.dtype = planned.dtype;
        shard.offsets = offsets;
        shard.sizes = planned.sizes;
        // write_item() only reads the bytes.
        shard.data = std::span<std::byte>(const_cast<std::byte*>(planned.bytes.data()), planned.bytes.size());
        std::uint64_t expected = dtype_itemsize(planned.dtype);
        for (std::int64_t d : planned.sizes) expected *= static_cast<std::uint64_t>(d);
        if (expected != planned.bytes.size()) {
          throw UsageError("save: item \"" + planned.index.fqn + "\": expected " + std::to_string(expected) +
                           " bytes of tensor data, found " + std::to_string(planned.bytes.size()));
        }
        values[f].emplace_back(std::move(shard));
      } else {
        values[f].emplace_back(pickle::ValuePtr{});
      }
    }
    for (std::size_t i = 0; i < items[f].size(); ++i) {
      const PlannedItem& planned = files[f].items[i];
      const bool tensor = planned.type == WriteItemType::kTensor;
      to_write[f].items.push_back(
          {&items[f][i], tensor ? &values[f][i] : nullptr, tensor ? ByteSpan{} : planned.bytes});
    }
  }
  save_steps::CommittedFiles committed;
  try {
    return save_steps::write_item_files(to_write, checkpoint, options, committed);
  } catch (...) {
    committed.remove_all(checkpoint);
    throw;
  }
}

void commit_planned(storage::Storage& checkpoint, std::string_view metadata_bytes,
                    const std::vector<WrittenItem>& written, const SaveOptions& options) {
  // The load index needs the decoded metadata. decode_metadata keeps the planner_data
  // pickle too; when every entry of it decoded as a path (DCP's planners write nothing
  // else) the decoded map says all of it. A form shardpoint cannot index (an entry that is
  // not a path, a field the codec does not know) commits without an index, which costs
  // loads only their shortcut.
  std::optional<format::Metadata> metadata;
  try {
    metadata = format::decode_metadata(as_bytes(metadata_bytes), kMetadataKey);
    const pickle::ValuePtr& raw = metadata->planner_data_raw;
    if (raw && (raw->is(pickle::Kind::kNone) ||
                (raw->is(pickle::Kind::kDict) && raw->entries().size() == metadata->planner_data.size()))) {
      metadata->planner_data_raw = nullptr;
    }
    if (metadata->planner_data_raw) metadata.reset();
  } catch (const FormatError&) {
    metadata.reset();
  }
  save_steps::publish_checkpoint(checkpoint, metadata_bytes, metadata ? &*metadata : nullptr, {written}, options);
}

PlannedReader::PlannedReader(storage::Storage& checkpoint, PlannedReaderOptions options)
    : checkpoint_(checkpoint), options_(options), sources_(std::make_unique<SourceCache>(checkpoint)) {
  std::optional<std::string> metadata = try_read_checkpoint_metadata(checkpoint);
  if (!metadata) {
    // A Hugging Face folder (or nothing: that throws "no .metadata"): its headers' Metadata,
    // encoded as `.metadata` is, for PyTorch's planner.
    metadata_ = read_folder_metadata(checkpoint).metadata;
    metadata_bytes_ = format::encode_metadata(*metadata_);
    raw_tensor_items_ = true;
    return;
  }
  metadata_bytes_ = std::move(*metadata);
  // Decoded once, for the transforms, DCP's safetensors items and metadata(). A `.metadata`
  // this build cannot decode is left to PyTorch's own unpickler (trusted reads); metadata()
  // then throws what the decoder said.
  try {
    metadata_ = format::decode_metadata(as_bytes(metadata_bytes_), checkpoint.describe_key(kMetadataKey));
  } catch (const FormatError& e) {
    metadata_error_ = e.what();
  }
  // Callers name blobs by file and offset; the transforms to undo come from .metadata.
  if (metadata_) {
    for (const auto& [key, info] : metadata_->storage_data) {
      if (!info.transform_descriptors.empty()) {
        transforms_.emplace(std::make_pair(info.relative_path, info.offset), info.transform_descriptors);
      }
    }
  }
  if (std::optional<std::string> index = checkpoint.try_read_all(kIndexKey);
      index && index_matches(*index, as_bytes(metadata_bytes_))) {
    CheckpointIndex decoded = decode_checkpoint_index(*index, checkpoint.describe_key(kIndexKey));
    checksums_ = std::move(decoded.checksums);
    for (const auto& [key, start] : decoded.data_offsets) {
      auto info = decoded.metadata.storage_data.find(key);
      if (info != decoded.metadata.storage_data.end()) {
        data_offsets_.emplace(std::make_pair(info->second.relative_path, info->second.offset), start);
      }
    }
    return;
  }
  // DCP's safetensors serialization: PyTorch's planner gets the items' raw byte ranges.
  if (metadata_ && resolve_safetensors_items(*metadata_, checkpoint)) {
    metadata_bytes_ = format::encode_metadata(*metadata_);
    raw_tensor_items_ = true;
    return;
  }
  if (std::optional<std::string> sidecar = checkpoint.try_read_all(kChecksumSidecar)) {
    checksums_ = ChecksumSidecar::decode(*sidecar, checkpoint.describe_key(kChecksumSidecar));
  }
}

PlannedReader::~PlannedReader() = default;

const format::Metadata& PlannedReader::metadata() const {
  if (!metadata_) throw FormatError(metadata_error_);
  return *metadata_;
}

void PlannedReader::read_tensors(std::span<const PlannedTensorRead> requests) {
  // Requests of one blob share the opened blob (its headers are parsed once); blobs are read
  // in file order, what each needs announced to read-ahead before the readers reach it (an
  // object store sizes its GETs by what is announced, a local file starts its readahead).
  std::map<std::pair<std::string, std::uint64_t>, std::vector<const PlannedTensorRead*>> by_blob;
  for (const PlannedTensorRead& r : requests) by_blob[{r.blob.relative_path, r.blob.offset}].push_back(&r);
  std::vector<const std::vector<const PlannedTensorRead*>*> blobs;
  blobs.reserve(by_blob.size());
  for (const auto& [key, list] : by_blob) blobs.push_back(&list);

  std::vector<std::vector<ReadItem>> items(blobs.size());
  std::vector<std::vector<ByteRange>> blob_ranges(blobs.size());  // in the file
  FirstReads first_reads;
  for (std::size_t b = 0; b < blobs.size(); ++b) {
    const PlannedTensorRead& first = *blobs[b]->front();
    std::vector<const ReadItem*> item_pointers;
    items[b].reserve(blobs[b]->size());
    for (const PlannedTensorRead* r : *blobs[b]) {
      ReadItem& item = items[b].emplace_back();
      item.type = ReadItemType::kTensor;
      item.dest_index = format::MetadataIndex{r->fqn, Shape(r->lengths.size(), 0), std::nullopt};
      item.dest_offsets = Shape(r->lengths.size(), 0);
      item.storage_index = format::MetadataIndex{r->fqn, r->chunk.offsets, std::nullopt};
      item.storage_offsets = r->storage_offsets;
      item.lengths = r->lengths;
    }
    for (const ReadItem& item : items[b]) item_pointers.push_back(&item);
    if (!transforms_of(first.blob).empty()) {
      blob_ranges[b].push_back({first.blob.offset, first.blob.length});  // a zstd item is read whole
    } else {
      for (const ByteRange& r : SavedTensorBlob::needed_blob_ranges(item_pointers, first.chunk.sizes,
                                                                    dtype_itemsize(first.dtype), first.blob.length)) {
        blob_ranges[b].push_back({first.blob.offset + r.offset, r.length});
      }
    }
    for (const ByteRange& r : blob_ranges[b]) first_reads.add(first.blob.relative_path, r.offset, r.length);
  }
  // The files opened at once, each with how far its first needed bytes go (an object store
  // brings them with the request that opens it: another rank's small items).
  sources_->open_all(first_reads.files(), static_cast<std::size_t>(std::max(options_.thread_count, 1)));
  std::vector<std::vector<ReadAhead::Range>> ranges(blobs.size());
  for (std::size_t b = 0; b < blobs.size(); ++b) {
    std::shared_ptr<const ByteSource> file = sources_->get(blobs[b]->front()->blob.relative_path);
    for (const ByteRange& r : blob_ranges[b]) ranges[b].push_back({file, r.offset, r.length});
  }
  ReadAhead read_ahead(std::move(ranges));

  parallel_for(blobs.size(), static_cast<std::size_t>(std::max(options_.thread_count, 1)), [&](std::size_t b) {
    read_ahead.starting(b);
    const PlannedTensorRead& first = *blobs[b]->front();
    BlobChecksums checksums;
    if (verified()) {
      checksums.algorithm = checksums_->algorithm();
      checksums.block_size = checksums_->block_size();
      checksums.item = checksums_->find(first.blob.relative_path, first.blob.offset);
    }
    if (checksums.item == nullptr && checks_zip_crc()) checksums.zip_crc = &zip_crc_;
    std::optional<std::uint64_t> data_offset;
    if (raw_tensor_items_) {
      data_offset = 0;
    } else if (auto it = data_offsets_.find({first.blob.relative_path, first.blob.offset});
               it != data_offsets_.end() && checksums.zip_crc == nullptr) {
      data_offset = it->second;  // not with zip CRC-32s: they are in the blob's central directory
    }
    format::StorageInfo info = first.blob;
    info.transform_descriptors = transforms_of(first.blob);
    SavedTensorBlob blob(sources_->get(first.blob.relative_path), info, first.fqn, first.chunk, first.dtype,
                         data_offset, /*defer_transformed=*/true);
    for (std::size_t i = 0; i < items[b].size(); ++i) {
      const PlannedTensorRead& r = *(*blobs[b])[i];
      blob.read_into(items[b][i], r.dest, r.lengths, checksums);
    }
  });
}

const std::vector<std::string>& PlannedReader::transforms_of(const format::StorageInfo& blob) const {
  if (!blob.transform_descriptors.empty()) return blob.transform_descriptors;
  static const std::vector<std::string> kNone;
  auto it = transforms_.find({blob.relative_path, blob.offset});
  return it != transforms_.end() ? it->second : kNone;
}

std::string PlannedReader::read_blob(const format::StorageInfo& blob, const std::string& fqn) {
  if (!transforms_of(blob).empty()) {
    // A zstd item (docs/dcp-format.md §2.4): its sidecar entry covers the stored bytes.
    const std::string where = checkpoint_.describe_key(blob.relative_path) + ": item \"" + fqn + "\"";
    BlobChecksums checksums;
    if (verified()) {
      checksums.algorithm = checksums_->algorithm();
      checksums.item = checksums_->find(blob.relative_path, blob.offset);
    }
    ReadCounts counts;
    format::StorageInfo info = blob;
    info.transform_descriptors = transforms_of(blob);
    FirstReads first_read;
    first_read.add(blob.relative_path, blob.offset, blob.length);
    const std::unique_ptr<ByteSource> source = read_item_blob(
        sources_->get(blob.relative_path, first_read.files().front().second), info, where, checksums, counts);
    if (checksums.item == nullptr && checks_zip_crc()) {
      std::optional<torchfile::ZipArchive> archive;
      try {
        archive.emplace(*source);
      } catch (const Error&) {
        rethrow_with_context(where);
      }
      zip_crc_.count(check_records_but(*archive, "", blob.offset, where));
    }
    return source->read_string(0, source->size(), where);
  }
  std::string bytes(blob.length, '\0');
  checkpoint_.read(blob.relative_path, blob.offset, std::as_writable_bytes(std::span<char>(bytes)));
  const ItemChecksums* entry = verified() ? checksums_->find(blob.relative_path, blob.offset) : nullptr;
  if (entry == nullptr) {
    if (checks_zip_crc()) {
      const std::string where = checkpoint_.describe_key(blob.relative_path) + ": item \"" + fqn + "\"";
      const MemorySource source(as_bytes(bytes), where);
      std::optional<torchfile::ZipArchive> archive;
      try {
        archive.emplace(source);
      } catch (const Error&) {
        rethrow_with_context(where);
      }
      zip_crc_.count(check_records_but(*archive, "", blob.offset, where));
    }
    return bytes;
  }
  const std::uint64_t found = checksum_of(checksums_->algorithm(), as_bytes(bytes));
  if (entry->length != blob.length || found != entry->checksum) {
    throw FormatError(checkpoint_.describe_key(blob.relative_path) + ": item \"" + fqn + "\" at offset " +
                      std::to_string(blob.offset) + ": checksum mismatch: expected " +
                      checksum_to_hex(checksums_->algorithm(), entry->checksum) + ", found " +
                      checksum_to_hex(checksums_->algorithm(), found));
  }
  return bytes;
}

}  // namespace shardpoint::engine
