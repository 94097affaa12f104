// encode_metadata() and same_encoded_content() (metadata_codec.h): format::Metadata as the
// `.metadata` pickle every PyTorch 2.0 ... newest loads (docs/dcp-format.md §3.7).
#include "format/metadata_codec.h"

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "format/metadata_codec_text.h"
#include "pickle/writer.h"
#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

using codec_text::has_negative;
using codec_text::quote;
using codec_text::shape_text;
using pickle::CallKind;
using pickle::Value;
using pickle::ValuePtr;

// Module paths written by encode_metadata (docs/dcp-format.md §3.7). Readers of every 2.x release have them.
constexpr std::string_view kDcpMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr std::string_view kDcpFilesystemModule = "torch.distributed.checkpoint.filesystem";
constexpr std::string_view kShardedTensorModule = "torch.distributed._shard.sharded_tensor.metadata";

class Encoder {
 public:
  std::string encode(const Metadata& md) {
    validate(md);
    DictBuilder state_dict_metadata(*this);
    // In key_order's order when it is set (decoded, or a union of per-rank files: the
    // saver's state dict order, which consolidation keeps), then any other key.
    std::vector<const std::pair<const std::string, StorageMetadata>*> entries;
    std::set<std::string_view> placed;
    for (const std::string& fqn : md.key_order) {
      auto it = md.state_dict_metadata.find(fqn);
      if (it != md.state_dict_metadata.end() && placed.insert(it->first).second) entries.push_back(&*it);
    }
    for (const auto& entry : md.state_dict_metadata) {
      if (!placed.contains(entry.first)) entries.push_back(&entry);
    }
    for (const auto* e : entries) {
      const std::string& fqn = e->first;
      const StorageMetadata& entry = e->second;
      if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
        state_dict_metadata.add(fqn, tensor(*t));
      } else {
        // BUILD {} as in §3.7; PyTorch on Python >= 3.11 omits it, both load.
        state_dict_metadata.add(fqn, instance(bytes_cls_, Value::dict()));
      }
    }

    DictBuilder planner_data(*this);
    for (const auto& [fqn, path] : effective_planner_data(md)) {
      std::vector<ValuePtr> items;
      for (const PathElement& e : path) {
        if (const auto* s = std::get_if<std::string>(&e)) {
          items.push_back(text(*s));
        } else {
          items.push_back(Value::integer(std::get<std::int64_t>(e)));
        }
      }
      planner_data.add(fqn, Value::tuple(std::move(items)));
    }

    pickle::DictEntries storage_data;
    for (const auto& [index, info] : md.storage_data) {
      storage_data.emplace_back(metadata_index(md, index), storage_info(info));
    }

    DictBuilder root_state(*this);
    root_state.add("state_dict_metadata", state_dict_metadata.take());
    root_state.add("planner_data", planner_data.take());
    root_state.add("storage_data", Value::dict(std::move(storage_data)));
    ValuePtr root = instance(metadata_cls_, root_state.take());
    return pickle::pickle_to_string(*root, pickle::WriteOptions{.protocol = 2});
  }

  static std::map<std::string, ObjectPath> effective_planner_data(const Metadata& md) {
    std::map<std::string, ObjectPath> out = md.planner_data;
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      if (!out.contains(fqn)) out.emplace(fqn, ObjectPath{fqn});
    }
    return out;
  }

 private:
  // What decode_metadata would refuse (and PyTorch could not use) is a UsageError here, so
  // that every output decodes.
  static void validate(const Metadata& md) {
    auto fail = [](const std::string& where, const std::string& what) {
      throw UsageError("encode_metadata: " + where + ": " + what);
    };
    for (const auto& [fqn, entry] : md.state_dict_metadata) {
      const auto* t = std::get_if<TensorStorageMetadata>(&entry);
      if (t == nullptr) continue;
      const std::string where = "state_dict_metadata[" + quote(fqn) + "]";
      if (has_negative(t->size)) fail(where, "negative size " + shape_text(t->size));
      if (t->properties.memory_format < 0 || t->properties.memory_format > 2) {
        fail(where, "memory_format " + std::to_string(t->properties.memory_format) + " is not 0, 1 or 2");
      }
      for (std::size_t i = 0; i < t->chunks.size(); ++i) {
        const ChunkStorageMetadata& c = t->chunks[i];
        if (c.offsets.size() != t->size.size() || c.sizes.size() != t->size.size() || has_negative(c.offsets) ||
            has_negative(c.sizes)) {
          fail(where + ".chunks[" + std::to_string(i) + "]",
               "offsets " + shape_text(c.offsets) + " and sizes " + shape_text(c.sizes) +
                   " must be non-negative and of the tensor's rank " + std::to_string(t->size.size()));
        }
      }
    }
    constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    for (const auto& [index, info] : md.storage_data) {
      const std::string where = "storage_data[" + quote(index.fqn) + "]";
      if (index.offset && has_negative(*index.offset)) fail(where, "negative offset " + shape_text(*index.offset));
      if (info.offset > kMax || info.length > kMax) fail(where, "offset/length beyond 2^63-1");
    }
  }

  // One node per distinct text. The writer memoizes by node, so a repeated key, fqn or file
  // name costs a BINGET instead of another copy, as in PyTorch's own files (Python shares
  // those string objects); the file is about half the size and decodes faster.
  ValuePtr text(const std::string& s) {
    auto [it, inserted] = texts_.try_emplace(s);
    if (inserted) it->second = Value::str(s);
    return it->second;
  }

  class DictBuilder {
   public:
    explicit DictBuilder(Encoder& encoder) : encoder_(encoder) {}
    void add(const std::string& key, ValuePtr value) { entries_.emplace_back(encoder_.text(key), std::move(value)); }
    ValuePtr take() { return Value::dict(std::move(entries_)); }

   private:
    Encoder& encoder_;
    pickle::DictEntries entries_;
  };

  // cls.__new__(cls) + BUILD state, the default dataclass pickling (docs/dcp-format.md §3.3).
  static ValuePtr instance(const ValuePtr& cls, ValuePtr state) {
    ValuePtr obj = Value::object(CallKind::kNewObj, cls, Value::tuple());
    obj->set_state(std::move(state));
    return obj;
  }

  ValuePtr size(const Shape& shape) {
    std::vector<ValuePtr> dims;
    dims.reserve(shape.size());
    for (std::int64_t d : shape) dims.push_back(Value::integer(d));
    return Value::object(CallKind::kReduce, torch_size_, Value::tuple({Value::tuple(std::move(dims))}));
  }

  ValuePtr tensor(const TensorStorageMetadata& t) {
    const TensorProperties& p = t.properties;
    std::vector<ValuePtr> fields{Value::global("torch", std::string(dtype_name(p.dtype))), strided_layout_,
                                 Value::boolean(p.requires_grad), memory_format(p.memory_format),
                                 Value::boolean(p.pin_memory)};
    if (p.strides) {
      std::vector<ValuePtr> strides;
      for (std::int64_t d : *p.strides) strides.push_back(Value::integer(d));
      fields.push_back(Value::tuple(std::move(strides)));
    }
    ValuePtr props = instance(properties_cls_, Value::tuple(std::move(fields)));
    std::vector<ValuePtr> chunks;
    chunks.reserve(t.chunks.size());
    for (const ChunkStorageMetadata& c : t.chunks) {
      DictBuilder cs(*this);
      cs.add("offsets", size(c.offsets));
      cs.add("sizes", size(c.sizes));
      chunks.push_back(instance(chunk_cls_, cs.take()));
    }
    DictBuilder state(*this);
    state.add("properties", std::move(props));
    state.add("size", size(t.size));
    state.add("chunks", Value::list(std::move(chunks)));
    return instance(tensor_cls_, state.take());
  }

  // torch.strided and the MEM_FORMAT_ENCODING members are singletons in Python, pickled
  // once and then fetched from the memo; so here.
  ValuePtr memory_format(int encoding) {
    auto [it, inserted] = memory_formats_.try_emplace(encoding);
    if (inserted) it->second = Value::object(CallKind::kReduce, mem_format_, Value::tuple({Value::integer(encoding)}));
    return it->second;
  }

  ValuePtr metadata_index(const Metadata& md, const MetadataIndex& index) {
    ValuePtr hint = Value::none();
    if (index.index) {
      hint = Value::integer(*index.index);
    } else if (index.offset) {
      auto it = md.state_dict_metadata.find(index.fqn);
      if (it != md.state_dict_metadata.end()) {
        if (const auto* t = std::get_if<TensorStorageMetadata>(&it->second)) {
          for (std::size_t i = 0; i < t->chunks.size(); ++i) {
            if (t->chunks[i].offsets == *index.offset) {
              hint = Value::integer(static_cast<std::int64_t>(i));
              break;
            }
          }
        }
      }
    }
    // Field order of MetadataIndex.__init__: fqn, index, then offset only when not None.
    DictBuilder state(*this);
    state.add("fqn", text(index.fqn));
    state.add("index", std::move(hint));
    if (index.offset) state.add("offset", size(*index.offset));
    return instance(index_cls_, state.take());
  }

  ValuePtr storage_info(const StorageInfo& info) {
    DictBuilder state(*this);
    state.add("relative_path", text(info.relative_path));
    state.add("offset", Value::integer(static_cast<std::int64_t>(info.offset)));
    state.add("length", Value::integer(static_cast<std::int64_t>(info.length)));
    if (!info.transform_descriptors.empty()) {
      std::vector<ValuePtr> items;
      for (const std::string& d : info.transform_descriptors) items.push_back(text(d));
      state.add("transform_descriptors", Value::list(std::move(items)));
    }
    return instance(storage_info_cls_, state.take());
  }

  // Shared global nodes: the writer emits each once and refers to it through the memo.
  ValuePtr metadata_cls_ = Value::global(std::string(kDcpMetadataModule), "Metadata");
  ValuePtr tensor_cls_ = Value::global(std::string(kDcpMetadataModule), "TensorStorageMetadata");
  ValuePtr bytes_cls_ = Value::global(std::string(kDcpMetadataModule), "BytesStorageMetadata");
  ValuePtr chunk_cls_ = Value::global(std::string(kDcpMetadataModule), "ChunkStorageMetadata");
  ValuePtr index_cls_ = Value::global(std::string(kDcpMetadataModule), "MetadataIndex");
  ValuePtr storage_info_cls_ = Value::global(std::string(kDcpFilesystemModule), "_StorageInfo");
  ValuePtr properties_cls_ = Value::global(std::string(kShardedTensorModule), "TensorProperties");
  ValuePtr mem_format_ = Value::global(std::string(kShardedTensorModule), "MEM_FORMAT_ENCODING");
  ValuePtr torch_size_ = Value::global("torch", "Size");
  ValuePtr get_layout_ = Value::global("torch.serialization", "_get_layout");
  ValuePtr strided_layout_ = Value::object(CallKind::kReduce, get_layout_, Value::tuple({Value::str("torch.strided")}));
  std::map<int, ValuePtr> memory_formats_;
  std::unordered_map<std::string, ValuePtr> texts_;
};

}  // namespace

std::string encode_metadata(const Metadata& metadata) { return Encoder().encode(metadata); }

bool same_encoded_content(const Metadata& a, const Metadata& b) {
  return a.state_dict_metadata == b.state_dict_metadata && a.storage_data == b.storage_data &&
         Encoder::effective_planner_data(a) == Encoder::effective_planner_data(b);
}

}  // namespace shardpoint::format
