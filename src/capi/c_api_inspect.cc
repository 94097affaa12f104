// sp_inspect (include/shardpoint/c_api.h): a checkpoint folder's structure as a result struct
// whose arrays and strings point into one block the library owns (InspectResultOwner),
// freed by sp_inspect_result_free.
#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "capi/c_api_util.h"
#include "engine/checkpoint_location.h"
#include "engine/checksum_sidecar.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"

namespace {

using namespace shardpoint;
using namespace shardpoint::capi;

// What an sp_inspect_result points into. The metadata owns every string and shape; the
// vectors below are filled once and never grow after their data() is handed out.
struct InspectResultOwner {
  format::Metadata metadata;
  std::vector<std::string> dtypes;                    // one per tensor, NUL-terminated
  std::vector<std::vector<const char*>> descriptors;  // one per chunk and object
  std::vector<sp_inspect_chunk> chunks;               // every tensor's, tensor by tensor
  std::vector<sp_inspect_tensor> tensors;
  std::vector<sp_inspect_object> objects;
  std::vector<std::string> files;
  std::vector<const char*> file_names;
};

// A blob's place, or file = NULL where the metadata names none.
sp_storage_info storage_of(const format::Metadata& m, const format::MetadataIndex& index,
                           std::vector<const char*>& descriptors) {
  auto info = m.storage_data.find(index);
  if (info == m.storage_data.end()) return sp_storage_info{};
  return storage_info_view(info->second, descriptors);
}

// Fills owner's arrays from owner.metadata.
void fill(InspectResultOwner& owner) {
  const format::Metadata& m = owner.metadata;
  std::size_t chunk_count = 0;
  std::size_t blobs = 0;
  for (const auto& [fqn, entry] : m.state_dict_metadata) {
    const auto* t = std::get_if<format::TensorStorageMetadata>(&entry);
    chunk_count += t != nullptr ? t->chunks.size() : 0;
    blobs += t != nullptr ? t->chunks.size() : 1;
  }
  owner.chunks.reserve(chunk_count);
  owner.descriptors.reserve(blobs);
  std::vector<std::size_t> first_chunk;  // per tensor: its first chunk in owner.chunks
  for (const auto& [fqn, entry] : m.state_dict_metadata) {
    if (const auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) {
      first_chunk.push_back(owner.chunks.size());
      for (const format::ChunkStorageMetadata& chunk : t->chunks) {
        if (chunk.offsets.size() != t->size.size() || chunk.sizes.size() != t->size.size()) {
          throw FormatError(".metadata: tensor \"" + fqn + "\": a chunk has " + std::to_string(chunk.offsets.size()) +
                            " offsets and " + std::to_string(chunk.sizes.size()) + " sizes, the tensor " +
                            std::to_string(t->size.size()) + " dimensions");
        }
        owner.descriptors.emplace_back();
        owner.chunks.push_back(sp_inspect_chunk{
            chunk.offsets.data(), chunk.sizes.data(),
            storage_of(m, format::MetadataIndex{fqn, chunk.offsets, std::nullopt}, owner.descriptors.back())});
      }
      owner.dtypes.emplace_back(dtype_name(t->properties.dtype));
      owner.tensors.push_back(sp_inspect_tensor{fqn.c_str(), nullptr, static_cast<int>(t->size.size()), t->size.data(),
                                                t->chunks.size(), nullptr});
    } else {
      owner.descriptors.emplace_back();
      owner.objects.push_back(sp_inspect_object{
          fqn.c_str(),
          storage_of(m, format::MetadataIndex{fqn, std::nullopt, std::nullopt}, owner.descriptors.back())});
    }
  }
  // owner.dtypes and owner.chunks are complete: their elements no longer move.
  for (std::size_t i = 0; i < owner.tensors.size(); ++i) {
    owner.tensors[i].dtype = owner.dtypes[i].c_str();
    owner.tensors[i].chunks = owner.tensors[i].chunk_count > 0 ? &owner.chunks[first_chunk[i]] : nullptr;
  }
  std::set<std::string> files;
  for (const auto& [index, info] : m.storage_data) files.insert(info.relative_path);
  owner.files.assign(files.begin(), files.end());
  for (const std::string& f : owner.files) owner.file_names.push_back(f.c_str());
}

}  // namespace

extern "C" {

void sp_inspect_options_init(sp_inspect_options* options) { reset_sized(options); }

void sp_inspect_result_init(sp_inspect_result* result) { reset_sized(result); }

void sp_inspect_result_free(sp_inspect_result* result) {
  if (result == nullptr || result->struct_size < offsetof(sp_inspect_result, owner) + sizeof(void*)) return;
  delete static_cast<InspectResultOwner*>(result->owner);
  result->owner = nullptr;
  // The arrays (each after its count) the caller's struct_size reaches.
  const auto reaches = [&](std::size_t offset) { return result->struct_size >= offset + sizeof(void*); };
  if (reaches(offsetof(sp_inspect_result, tensors))) {
    result->tensor_count = 0;
    result->tensors = nullptr;
  }
  if (reaches(offsetof(sp_inspect_result, objects))) {
    result->object_count = 0;
    result->objects = nullptr;
  }
  if (reaches(offsetof(sp_inspect_result, files))) {
    result->file_count = 0;
    result->files = nullptr;
  }
}

sp_status sp_inspect(const char* path_or_url, const sp_inspect_options* options, sp_inspect_result* result,
                     char** error) {
  return guarded(error, [&] {
    require(result != nullptr, "result is NULL");
    require(result->struct_size >= offsetof(sp_inspect_result, owner) + sizeof(void*), "result struct_size too small");
    write_result(result, sp_inspect_result{});  // holds nothing until the call succeeds
    [[maybe_unused]] const sp_inspect_options o = read_options(options, &sp_inspect_options_init);
    auto st = storage::open_storage(location_arg(path_or_url, "path_or_url is NULL"));
    engine::CheckpointReader reader(*st);  // reads the sidecar, to name its algorithm
    auto owner = std::make_unique<InspectResultOwner>();
    owner->metadata = reader.metadata();
    fill(*owner);
    sp_inspect_result full{};
    full.format = checkpoint_format_value(engine::folder_kind(*st));
    full.sidecar = reader.sidecar() != nullptr ? checksum_value(reader.sidecar()->algorithm()) : SP_CHECKSUM_NONE;
    full.tensor_count = owner->tensors.size();
    full.tensors = owner->tensors.empty() ? nullptr : owner->tensors.data();
    full.object_count = owner->objects.size();
    full.objects = owner->objects.empty() ? nullptr : owner->objects.data();
    full.file_count = owner->files.size();
    full.files = owner->file_names.empty() ? nullptr : owner->file_names.data();
    full.owner = owner.release();
    write_result(result, full);
  });
}

}  // extern "C"
