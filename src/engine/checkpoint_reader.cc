#include "shardpoint/checkpoint_reader.h"

#include <map>
#include <optional>

#include "engine/checksum_sidecar.h"
#include "engine/folder_metadata.h"
#include "engine/item_reader.h"
#include "engine/load_plan.h"
#include "engine/saved_object.h"
#include "engine/zip_crc_ledger.h"
#include "format/checkpoint_path.h"
#include "format/metadata_codec.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

struct CheckpointReader::State {
  explicit State(storage::Storage& storage) : sources(storage) {}
  std::optional<ChecksumSidecar> sidecar;
  SourceCache sources;
  std::map<std::string, std::unique_ptr<format::Metadata>> per_tensor;  // guarded by mu_
  ZipCrcLedger zip_crc;  // thread-safe; what reads checked, not the reader's state
};

CheckpointReader::CheckpointReader(storage::Storage& storage, CheckpointReaderOptions options)
    : storage_(storage), options_(options), state_(std::make_unique<State>(storage)) {
  FolderMetadata folder = read_folder_metadata(storage_);
  metadata_ = std::move(folder.metadata);
  raw_tensor_items_ = folder.raw_tensor_items;
  if (options_.verify_checksums && folder.kind == CheckpointKind::kDcp) {
    if (auto sidecar = storage_.try_read_all(kChecksumSidecar)) {
      state_->sidecar = ChecksumSidecar::decode(*sidecar, storage_.describe_key(kChecksumSidecar));
    }
  }
}

CheckpointReader::~CheckpointReader() = default;

ZipCrcCounts CheckpointReader::zip_crc_counts() const { return state_->zip_crc.counts(); }

const ChecksumSidecar* CheckpointReader::sidecar() const { return state_->sidecar ? &*state_->sidecar : nullptr; }

const format::TensorStorageMetadata& CheckpointReader::tensor(const std::string& fqn) const {
  auto it = metadata_.state_dict_metadata.find(fqn);
  if (it == metadata_.state_dict_metadata.end()) throw PlanError("checkpoint has no key \"" + fqn + "\"");
  const auto* tensor = std::get_if<format::TensorStorageMetadata>(&it->second);
  if (tensor == nullptr) throw PlanError("\"" + fqn + "\" is an object, not a tensor");
  return *tensor;
}

std::shared_ptr<const ByteSource> CheckpointReader::source(const std::string& relative_path) {
  if (!format::is_safe_relative_path(relative_path)) {
    throw FormatError(storage_.describe_key(kMetadataKey) + ": relative_path '" + relative_path +
                      "' escapes the checkpoint folder");
  }
  return state_->sources.get(relative_path);
}

BlobChecksums CheckpointReader::checksums_for(const format::StorageInfo& info) const {
  BlobChecksums cs;
  if (const ChecksumSidecar* sidecar = this->sidecar()) {
    cs.algorithm = sidecar->algorithm();
    cs.block_size = sidecar->block_size();
    cs.item = sidecar->find(info.relative_path, info.offset);
  }
  if (cs.item == nullptr && options_.verify_checksums && options_.check_zip_crc) {
    cs.zip_crc = &state_->zip_crc;
  }
  return cs;
}

const format::StorageInfo& CheckpointReader::storage_info(const format::MetadataIndex& index) const {
  auto it = metadata_.storage_data.find(format::MetadataIndex{index.fqn, index.offset, std::nullopt});
  if (it == metadata_.storage_data.end()) {
    throw FormatError(storage_.describe_key(kMetadataKey) + ": item \"" + index.fqn +
                      "\": expected a storage_data entry, found none");
  }
  return it->second;
}

void CheckpointReader::read_box(const std::string& fqn, const Shape& offsets, const Shape& sizes,
                                std::span<std::byte> dest) {
  const format::TensorStorageMetadata& meta = tensor(fqn);
  // Plan the box as a one-leaf load: the same overlap math and coverage checks as load().
  TensorShard box;
  box.dtype = meta.properties.dtype;
  box.global_shape = meta.size;
  box.offsets = offsets;
  box.sizes = sizes;
  box.data = dest;
  FlatStateDict requested;
  requested.items.emplace(fqn, box);
  requested.planner_data.emplace(fqn, format::ObjectPath{fqn});
  // Plan against this tensor's entries only: planning against the whole .metadata on every
  // call would make reading a checkpoint tensor by tensor quadratic in its size.
  const LoadPlan plan = make_load_plan(tensor_metadata(fqn), requested, LoadPlanOptions{});
  for (const ReadItem& item : plan.items) {
    const format::ChunkStorageMetadata* chunk = nullptr;
    for (const auto& c : meta.chunks) {
      if (item.storage_index.offset && c.offsets == *item.storage_index.offset) chunk = &c;
    }
    if (chunk == nullptr) throw FormatError("\"" + fqn + "\": read plan names a chunk the metadata lacks");
    const format::StorageInfo& info = storage_info(item.storage_index);
    SavedTensorBlob blob(source(info.relative_path), info, fqn, *chunk, meta.properties.dtype,
                         raw_tensor_items_ ? std::optional<std::uint64_t>(0) : std::nullopt,
                         /*defer_transformed=*/true);
    blob.read_into(item, dest, sizes, checksums_for(info));
    MutexLock lock(mu_);
    counts_ += blob.counts();
  }
}

const format::Metadata& CheckpointReader::tensor_metadata(const std::string& fqn) {
  MutexLock lock(mu_);
  auto cached = state_->per_tensor.find(fqn);
  if (cached != state_->per_tensor.end()) return *cached->second;
  auto md = std::make_unique<format::Metadata>();
  md->state_dict_metadata.emplace(fqn, metadata_.state_dict_metadata.at(fqn));
  for (auto it = metadata_.storage_data.lower_bound(format::MetadataIndex{fqn, std::nullopt, std::nullopt});
       it != metadata_.storage_data.end() && it->first.fqn == fqn; ++it) {
    md->storage_data.insert(*it);
  }
  return *state_->per_tensor.emplace(fqn, std::move(md)).first->second;
}

pickle::ValuePtr CheckpointReader::read_object(const std::string& fqn) { return read_object_file(fqn)->root(); }

std::shared_ptr<const torchfile::TorchFile> CheckpointReader::read_object_file(const std::string& fqn) {
  auto it = metadata_.state_dict_metadata.find(fqn);
  if (it == metadata_.state_dict_metadata.end()) throw PlanError("checkpoint has no key \"" + fqn + "\"");
  if (!std::holds_alternative<format::BytesStorageMetadata>(it->second)) {
    throw PlanError("\"" + fqn + "\" is a tensor, not an object");
  }
  const format::StorageInfo& info = storage_info(format::MetadataIndex{fqn, std::nullopt, std::nullopt});
  ReadCounts counts;
  std::shared_ptr<const torchfile::TorchFile> file =
      open_saved_object(source(info.relative_path), info, fqn, checksums_for(info), counts);
  MutexLock lock(mu_);
  counts_ += counts;
  return file;
}

ReadCounts CheckpointReader::counts() const {
  MutexLock lock(mu_);
  return counts_;
}

}  // namespace shardpoint::engine
