#include "engine/torch_save.h"

#include <algorithm>
#include <numeric>

#include "shardpoint/error.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::engine {
namespace {

using pickle::Value;
using pickle::ValuePtr;

struct PendingStorage {
  std::string key;
  std::span<const std::byte> data;
};

std::uint64_t volume(const Shape& shape) {
  std::uint64_t n = 1;
  for (auto s : shape) n *= static_cast<std::uint64_t>(s);
  return n;
}

void check_whole_tensor(const TensorShard& t, const std::string& where) {
  bool at_origin = std::all_of(t.offsets.begin(), t.offsets.end(), [](std::int64_t o) { return o == 0; });
  if (!at_origin || t.sizes != t.global_shape) {
    throw UsageError(where + ": a torch.save file holds whole tensors; this leaf is a shard of a larger tensor");
  }
  if (t.data.size() != volume(t.sizes) * dtype_itemsize(t.dtype)) {
    throw UsageError(where + ": tensor data has " + std::to_string(t.data.size()) + " bytes, expected " +
                     std::to_string(volume(t.sizes) * dtype_itemsize(t.dtype)));
  }
}

ValuePtr to_value(const StateNode& node, const std::string& where, std::vector<PendingStorage>& storages) {
  if (node.is_tensor()) {
    const TensorShard& t = node.tensor();
    check_whole_tensor(t, where.empty() ? "<root>" : where);
    std::string key = std::to_string(storages.size());
    storages.push_back({key, t.data});
    auto strides = torchfile::contiguous_strides(t.global_shape);
    return torchfile::make_tensor_node(t.dtype, t.global_shape, strides, 0, key, volume(t.global_shape), "cpu",
                                       t.requires_grad);
  }
  if (node.is_object()) return node.object() ? node.object() : Value::none();
  auto child = [&](const std::string& part) { return where.empty() ? part : where + "." + part; };
  if (node.is_list()) {
    auto list = Value::list();
    for (std::size_t i = 0; i < node.list().size(); ++i) {
      list->mutable_items().push_back(to_value(node.list()[i], child(std::to_string(i)), storages));
    }
    return list;
  }
  auto dict = Value::dict();
  for (const auto& [k, v] : node.dict()) {
    dict->mutable_entries().push_back({Value::str(k), to_value(v, child(k), storages)});
  }
  return dict;
}

}  // namespace

void write_torch_save(const StateNode& root, ByteSink& sink, const TorchSaveFileOptions& options) {
  std::vector<PendingStorage> storages;
  ValuePtr tree = to_value(root, "", storages);
  torchfile::TorchSaveOptions save_options;
  save_options.archive_name = options.archive_name;
  torchfile::TorchSaveWriter writer(sink, save_options);
  writer.write_pickle(*tree);
  for (const auto& s : storages) writer.write_storage(s.key, s.data);
  writer.finish();
}

}  // namespace shardpoint::engine
