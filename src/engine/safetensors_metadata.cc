#include "engine/safetensors_metadata.h"

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/chunking.h"
#include "format/safetensors_header.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

// An index JSON is a name per tensor; a model with a million tensors has ~100 MB of it.
// Anything larger is refused before it is read.
constexpr std::uint64_t kMaxIndexBytes = std::uint64_t{256} << 20;

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

std::uint64_t tensor_bytes(const format::Shape& sizes, DType dtype) {
  return static_cast<std::uint64_t>(volume(sizes)) * dtype_itemsize(dtype);
}

// The chunk `key` names (REQUIRES key.offset), found by its index hint first; nullptr when
// the tensor has none at that offset.
const format::ChunkStorageMetadata* chunk_of(const format::TensorStorageMetadata& tensor,
                                             const format::MetadataIndex& key) {
  if (key.index && *key.index >= 0 && static_cast<std::size_t>(*key.index) < tensor.chunks.size() &&
      tensor.chunks[static_cast<std::size_t>(*key.index)].offsets == *key.offset) {
    return &tensor.chunks[static_cast<std::size_t>(*key.index)];
  }
  for (const format::ChunkStorageMetadata& c : tensor.chunks) {
    if (c.offsets == *key.offset) return &c;
  }
  return nullptr;
}

format::SafetensorsHeader read_header(storage::Storage& folder, const std::string& key, std::uint64_t offset) {
  storage::SourceOptions options;
  options.prefer_mmap = false;
  std::unique_ptr<ByteSource> source = folder.open_source(key, options);
  return format::read_safetensors_header(*source, offset, folder.describe_key(key));
}

// The index JSON's weight_map: each tensor it lists must be in the file it names.
void check_index(storage::Storage& folder, const std::map<std::string, std::string>& file_of) {
  const std::optional<std::uint64_t> size = folder.try_stat(kHfIndexKey);
  if (!size) return;
  const std::string name = folder.describe_key(kHfIndexKey);
  if (*size > kMaxIndexBytes) {
    throw FormatError(name + ": " + std::to_string(*size) + " bytes, more than an index file has (limit " +
                      std::to_string(kMaxIndexBytes) + ")");
  }
  const std::string text = folder.try_read_all(kHfIndexKey).value_or(std::string());
  nlohmann::json index;
  try {
    // Depth 3 is all an index needs: {"weight_map": {name: file}}.
    index = nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > 3) throw FormatError(name + ": JSON nested deeper than an index file is");
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(name + ": not valid JSON: " + e.what());
  }
  const auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (map == index.end() || !map->is_object()) throw FormatError(name + ": expected an object with a \"weight_map\"");
  for (const auto& [fqn, file] : map->items()) {
    if (!file.is_string()) throw FormatError(name + ": weight_map " + in_quotes(fqn) + ": expected a file name");
    auto it = file_of.find(fqn);
    if (it == file_of.end() || it->second != file.get<std::string>()) {
      throw FormatError(name + ": weight_map puts tensor " + in_quotes(fqn) + " in " +
                        in_quotes(file.get<std::string>()) + ", found it " +
                        (it == file_of.end() ? "in no file" : "in " + in_quotes(it->second)));
    }
  }
}

}  // namespace

bool is_hf_tensor_file(std::string_view key) {
  return key.ends_with(".safetensors") && key.find('/') == std::string_view::npos;
}

format::Metadata read_hf_metadata(storage::Storage& folder) {
  std::vector<std::string> files;
  for (const storage::ObjectInfo& o : folder.list("")) {
    if (is_hf_tensor_file(o.key)) files.push_back(o.key);
  }
  if (files.empty()) {
    throw StorageError(StorageError::Kind::kNotFound,
                       folder.describe_key("") + ": not a Hugging Face checkpoint (no *.safetensors file)");
  }
  format::Metadata md;
  std::map<std::string, std::string> file_of;  // fqn -> the file of its (last) chunk
  for (const std::string& file : files) {
    const std::string name = folder.describe_key(file);
    const format::SafetensorsHeader header = read_header(folder, file, 0);
    const std::map<std::string, format::Shape> sharding = format::dcp_sharding_info(header, name);
    for (const format::SafetensorsTensor& t : header.tensors) {
      format::Shape offsets(t.shape.size(), 0);
      if (!sharding.empty()) {
        auto s = sharding.find(t.name);
        if (s == sharding.end()) {
          throw FormatError(name + ": tensor " + in_quotes(t.name) +
                            ": expected an entry in DCP_SHARDING_INFO, found none");
        }
        offsets = s->second;
      }
      auto [it, fresh] = md.state_dict_metadata.try_emplace(t.name, format::TensorStorageMetadata{});
      auto* tensor = std::get_if<format::TensorStorageMetadata>(&it->second);
      if (fresh) {
        tensor->properties.dtype = t.dtype;
        tensor->size = format::Shape(t.shape.size(), 0);
        md.key_order.push_back(t.name);
      } else if (tensor->properties.dtype != t.dtype || tensor->size.size() != t.shape.size()) {
        throw FormatError(name + ": tensor " + in_quotes(t.name) + ": " + std::string(dtype_name(t.dtype)) +
                          " of rank " + std::to_string(t.shape.size()) + ", another file holds it as " +
                          std::string(dtype_name(tensor->properties.dtype)) + " of rank " +
                          std::to_string(tensor->size.size()));
      }
      for (std::size_t d = 0; d < t.shape.size(); ++d) {
        tensor->size[d] = std::max(tensor->size[d], offsets[d] + t.shape[d]);
      }
      tensor->chunks.push_back({offsets, t.shape});
      format::StorageInfo info;
      info.relative_path = file;
      info.offset = header.data_start() + t.begin;
      info.length = t.end - t.begin;
      const format::MetadataIndex key{t.name, offsets, static_cast<std::int64_t>(tensor->chunks.size() - 1)};
      if (auto [slot, added] = md.storage_data.emplace(key, info); !added) {
        throw FormatError(name + ": tensor " + in_quotes(t.name) + " chunk at " + shape_to_string(offsets) +
                          ": also in " + in_quotes(slot->second.relative_path));
      }
      file_of[t.name] = file;
    }
  }
  check_index(folder, file_of);
  return md;
}

bool resolve_safetensors_items(format::Metadata& metadata, storage::Storage& folder) {
  // Which tensor items are safetensors items: length == byte count, no transforms. The first
  // tensor item decides; an ordinary checkpoint costs one lookup. When it is a safetensors
  // item, all must be (the headers are read next anyway).
  std::size_t raw = 0, zip = 0;
  for (const auto& [key, info] : metadata.storage_data) {
    auto entry = metadata.state_dict_metadata.find(key.fqn);
    if (!key.offset || entry == metadata.state_dict_metadata.end()) continue;
    const auto* tensor = std::get_if<format::TensorStorageMetadata>(&entry->second);
    if (tensor == nullptr) continue;
    const format::ChunkStorageMetadata* chunk = chunk_of(*tensor, key);
    if (chunk == nullptr) continue;  // check_metadata reports it
    const bool is_raw = info.length == tensor_bytes(chunk->sizes, tensor->properties.dtype);
    if (!is_raw && raw == 0) return false;
    (is_raw ? raw : zip) += 1;
    if (is_raw && !info.transform_descriptors.empty()) {
      throw FormatError(info.relative_path + ": item " + in_quotes(key.fqn) + ": a safetensors item with transforms (" +
                        info.transform_descriptors.front() + "), which PyTorch never applies to one");
    }
  }
  if (raw == 0) return false;
  if (zip != 0) {
    throw FormatError(".metadata: " + std::to_string(raw) + " tensor items are safetensors and " + std::to_string(zip) +
                      " are torch.save blobs; a DCP checkpoint has one serialization format");
  }
  struct Blob {
    format::SafetensorsHeader header;
    std::map<std::string, format::Shape> sharding;
  };
  std::map<std::pair<std::string, std::uint64_t>, Blob> blobs;
  for (auto& [key, info] : metadata.storage_data) {
    if (!key.offset) continue;  // bytes items stay torch.save blobs
    auto blob = blobs.find({info.relative_path, info.offset});
    if (blob == blobs.end()) {
      Blob b{read_header(folder, info.relative_path, info.offset), {}};
      b.sharding = format::dcp_sharding_info(b.header, folder.describe_key(info.relative_path));
      blob = blobs.emplace(std::make_pair(info.relative_path, info.offset), std::move(b)).first;
    }
    const format::SafetensorsHeader& header = blob->second.header;
    const std::string where = folder.describe_key(info.relative_path) + ": safetensors blob at " +
                              std::to_string(info.offset) + ": item " + in_quotes(key.fqn);
    const format::SafetensorsTensor* t = header.find(key.fqn);
    if (t == nullptr) throw FormatError(where + ": not in the blob's header");
    const auto& tensor = std::get<format::TensorStorageMetadata>(metadata.state_dict_metadata.at(key.fqn));
    const format::ChunkStorageMetadata* chunk = chunk_of(tensor, key);
    if (chunk == nullptr || t->dtype != tensor.properties.dtype || t->shape != chunk->sizes ||
        t->end - t->begin != info.length) {
      throw FormatError(where + ": .metadata says " + std::string(dtype_name(tensor.properties.dtype)) + " " +
                        (chunk ? shape_to_string(chunk->sizes) : std::string("(no chunk)")) + ", " +
                        std::to_string(info.length) + " bytes; the header " + std::string(dtype_name(t->dtype)) + " " +
                        shape_to_string(t->shape) + ", " + std::to_string(t->end - t->begin) + " bytes");
    }
    const std::map<std::string, format::Shape>& sharding = blob->second.sharding;
    if (auto s = sharding.find(key.fqn); s != sharding.end() && s->second != *key.offset) {
      throw FormatError(where + ": saved_offsets " + shape_to_string(s->second) + ", .metadata says " +
                        shape_to_string(*key.offset));
    }
    info.offset += header.data_start() + t->begin;
  }
  return true;
}

}  // namespace shardpoint::engine
