#include "engine/consolidated_tree.h"

#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "engine/flatten.h"
#include "engine/lightning_layout.h"
#include "pickle/tree_edit.h"
#include "shardpoint/error.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::engine {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// Builds the tree with placeholder nodes standing for tensors, then swaps each for its
// tensor node.
class TreeBuilder {
 public:
  // A stand-in node for a tensor whose bytes come from src. `label` only helps debugging.
  ValuePtr placeholder_for(TensorSource src, const std::string& label) {
    ValuePtr p = Value::tuple({Value::str(label)});
    placeholder_nodes_.push_back(p);
    placeholders_.emplace(p.get(), sources_.size());
    sources_.push_back(std::move(src));
    return p;
  }

  // The DCP part as a pickle dict, tensors as placeholders (dcp_to_torch_save's tree).
  ValuePtr build_dcp_tree(CheckpointReader& reader, const std::vector<std::string>& fqns, std::uint64_t& objects) {
    const format::Metadata& md = reader.metadata();
    StateNode root{StateDict{}};
    for (const std::string& fqn : fqns) {
      const auto& entry = md.state_dict_metadata.at(fqn);
      ValuePtr leaf;
      if (const auto* t = std::get_if<format::TensorStorageMetadata>(&entry)) {
        TensorSource src;
        src.fqn = fqn;
        src.dtype = t->properties.dtype;
        src.shape = t->size;
        leaf = placeholder_for(std::move(src), fqn);
      } else {
        std::shared_ptr<const torchfile::TorchFile> item = reader.read_object_file(fqn);
        leaf = item->root();
        if (leaf && pickle::holds_persistent_id(*leaf)) object_storages(fqn, item, leaf);
        ++objects;
      }
      set_at_path(root, object_path_of(md, fqn), StateNode(std::move(leaf)));
    }
    return to_pickle_value(root);
  }

  // Swaps each storage persistent id of `object` (the root of `item`, changed in place) for
  // a placeholder whose storage is copied from the item's archive.
  void object_storages(const std::string& fqn, const std::shared_ptr<const torchfile::TorchFile>& item,
                       ValuePtr& object) {
    const std::string where = item->source().name() + ": item \"" + fqn + "\"";
    pickle::replace_nodes(object, [&](const ValuePtr& node) -> ValuePtr {
      if (!node->is(Kind::kPersistentId)) return nullptr;
      TensorSource src;
      src.kind = TensorSourceKind::kObjectStorage;
      src.fqn = fqn;
      src.archive = item;
      src.storage = torchfile::parse_storage_pid(*node, where);
      src.dtype = DType::kUInt8;
      src.shape = {static_cast<std::int64_t>(src.storage.nbytes)};
      pids_.emplace(sources_.size(), node);
      return placeholder_for(std::move(src), fqn + " storage");
    });
  }

  // meta.pt's root with its tensors replaced by placeholders (read from meta.pt when their
  // turn comes).
  ValuePtr meta_tree(const torchfile::TorchFile& meta) {
    ValuePtr meta_root = meta.root();
    if (!meta_root || !meta_root->is(Kind::kDict)) {
      throw FormatError(meta.source().name() + ": expected a dict at the top, found " +
                        std::string(meta_root ? pickle::kind_name(meta_root->kind()) : "nothing"));
    }
    pickle::replace_nodes(meta_root, [&](const ValuePtr& node) -> ValuePtr {
      const torchfile::TensorInfo* info = meta.tensor_of(*node);
      if (info == nullptr) return nullptr;
      TensorSource src;
      src.kind = TensorSourceKind::kMetaTensor;
      src.meta = *info;
      src.dtype = info->dtype;
      src.shape = info->shape;
      return placeholder_for(std::move(src), "meta.pt tensor");
    });
    return meta_root;
  }

  // Replaces placeholders by tensor nodes (object storages: persistent ids) with storage
  // keys "0", "1", ... in the order the pickle writer meets them, one key per storage;
  // returns the source of each key.
  std::vector<TensorSource> assign_storages(ValuePtr& tree) {
    std::vector<TensorSource> by_key;
    // (item archive, storage key) -> the str node of its output key, one node per storage.
    std::map<std::pair<const torchfile::TorchFile*, std::string>, ValuePtr> object_keys;
    pickle::replace_nodes(tree, [&](const ValuePtr& node) -> ValuePtr {
      auto ph = placeholders_.find(node.get());
      if (ph == placeholders_.end()) return nullptr;
      const TensorSource& src = sources_[ph->second];
      if (src.kind == TensorSourceKind::kObjectStorage) {
        // References to one storage of an item share its key, as torch.save's do.
        auto [it, added] = object_keys.try_emplace({src.archive.get(), src.storage.key}, nullptr);
        if (added) {
          it->second = Value::str(std::to_string(by_key.size()));
          by_key.push_back(src);
        }
        return torchfile::rename_storage_pid(*pids_.at(ph->second), it->second);
      }
      std::string key = std::to_string(by_key.size());
      by_key.push_back(src);
      std::uint64_t numel = 1;
      for (auto d : src.shape) numel *= static_cast<std::uint64_t>(d);
      auto strides = torchfile::contiguous_strides(src.shape);
      const bool from_meta = src.kind == TensorSourceKind::kMetaTensor;
      bool requires_grad = from_meta && src.meta.requires_grad;
      ValuePtr made = torchfile::make_tensor_node(src.dtype, src.shape, strides, 0, key, numel, "cpu",
                                                  from_meta && !src.meta.is_parameter && requires_grad);
      if (from_meta && src.meta.is_parameter) made = torchfile::make_parameter_node(made, requires_grad);
      return made;
    });
    return by_key;
  }

 private:
  std::unordered_map<const Value*, std::size_t> placeholders_;  // placeholder -> sources_ index
  // Keeps every placeholder alive, so a placeholder the meta.pt merge drops from the tree
  // cannot have its address reused by a node that placeholders_ would then match.
  std::vector<ValuePtr> placeholder_nodes_;
  std::vector<TensorSource> sources_;
  std::unordered_map<std::size_t, ValuePtr> pids_;  // object storages: sources_ index -> its persistent id
};

}  // namespace

std::uint64_t TensorSource::nbytes() const {
  std::uint64_t n = dtype_itemsize(dtype);
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::vector<std::string> ordered_fqns(const format::Metadata& md, const std::vector<std::string>& order) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& fqn : order) {
    if (md.state_dict_metadata.count(fqn) && seen.insert(fqn).second) out.push_back(fqn);
  }
  for (const auto& [fqn, _] : md.state_dict_metadata) {
    if (seen.insert(fqn).second) out.push_back(fqn);
  }
  return out;
}

format::ObjectPath object_path_of(const format::Metadata& md, const std::string& fqn) {
  auto it = md.planner_data.find(fqn);
  if (it != md.planner_data.end() && !it->second.empty()) return it->second;
  return format::ObjectPath{fqn};
}

ConsolidatedTree build_consolidated_tree(CheckpointReader& reader, const std::vector<std::string>& fqns,
                                         ConsolidateLayout layout,
                                         const std::function<const torchfile::TorchFile*()>& open_meta) {
  TreeBuilder builder;
  ConsolidatedTree out;
  out.root = builder.build_dcp_tree(reader, fqns, out.objects);
  if (const torchfile::TorchFile* meta = open_meta()) {
    ValuePtr meta_root = builder.meta_tree(*meta);
    auto& entries = out.root->mutable_entries();
    merge_dict_update(entries, *meta_root);
    // The model key is told from the DCP part as saved (.metadata), not from meta.pt's keys.
    if (layout == ConsolidateLayout::kTrainer)
      apply_trainer_layout(entries, require_lightning_layout(reader.metadata()));
  }
  out.tensors = builder.assign_storages(out.root);
  return out;
}

}  // namespace shardpoint::engine
