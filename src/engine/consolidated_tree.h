// The object tree consolidate() writes with torch.save, built from a DCP checkpoint's
// .metadata (and meta.pt for the Lightning layouts) before any tensor data is read:
//   - the DCP state, nesting rebuilt from planner_data, keys in the given fqn order,
//     object items read whole; an object that holds tensors keeps its tree, and each
//     storage it references becomes a storage of the output, copied from the item's
//     archive (as dcp_to_torch_save's torch.load + torch.save: views and sharing kept);
//   - meta.pt merged on top (dict.update, as Lightning's _load_distributed_checkpoint), and
//     for kTrainer / kFabric Lightning's layout applied (engine/lightning_layout.h); kDcp
//     merges it only where the folder has one (a Lightning checkpoint keeps its trainer
//     state; a plain DCP folder gives what dcp_to_torch_save gives);
//   - every DCP and meta.pt tensor a contiguous CPU tensor node; every storage (of those
//     tensors and of the objects' tensors) gets the key "k", k counting in the order the
//     pickle writer meets them; tensors[k] says where its bytes are.
// DCP tensors get requires_grad false; meta.pt tensors keep requires_grad and Parameter-ness.
//
// Thread-safety: build_consolidated_tree() reads through the reader (thread-safe) and
// builds a new tree; the result belongs to the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/consolidate.h"
#include "shardpoint/dtype.h"
#include "shardpoint/metadata.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/torch_file.h"
#include "torchfile/tree_storages.h"

namespace shardpoint::engine {

enum class TensorSourceKind {
  kDcpTensor,      // a DCP tensor, read by box
  kMetaTensor,     // a meta.pt tensor, read whole
  kObjectStorage,  // a storage record of an object item's archive, read by byte range
};

// Where the bytes of one output storage come from.
struct TensorSource {
  TensorSourceKind kind = TensorSourceKind::kDcpTensor;
  std::string fqn;             // kDcpTensor: the tensor; kObjectStorage: the object item
  torchfile::TensorInfo meta;  // kMetaTensor
  // kObjectStorage: the item's archive (in memory) and the storage in it
  // (torchfile::read_storage_bytes reads it).
  std::shared_ptr<const torchfile::TorchFile> archive;
  torchfile::StorageRef storage;
  // kObjectStorage: uint8 and {bytes}.
  DType dtype = DType::kFloat32;
  format::Shape shape;
  std::uint64_t nbytes() const;
};

struct ConsolidatedTree {
  pickle::ValuePtr root;
  std::vector<TensorSource> tensors;  // tensors[k]: the bytes of storage key "k"
  std::uint64_t objects = 0;          // DCP object items carried through
};

// The checkpoint's fqns in `order` (Metadata::key_order: the order the file lists them,
// in which PyTorch's _EmptyStateDictLoadPlanner builds and dcp_to_torch_save writes the
// state), then any others sorted.
std::vector<std::string> ordered_fqns(const format::Metadata& md, const std::vector<std::string>& order);

// The nesting path of fqn (its planner_data entry, or {fqn} when it has none).
format::ObjectPath object_path_of(const format::Metadata& md, const std::string& fqn);

// Builds the tree (see the top of this file). fqns: every fqn of reader.metadata(), in
// output order. open_meta: returns meta.pt (which must outlive the call), or null where
// the folder has none (kDcp only: the other layouts require it); called once, after the
// DCP part is built. Throws FormatError (an
// object item's bad persistent ids; meta.pt's root not a dict), PlanError (Lightning's
// KeyErrors, apply_trainer_layout()), and what reading an object item or open_meta throws.
ConsolidatedTree build_consolidated_tree(CheckpointReader& reader, const std::vector<std::string>& fqns,
                                         ConsolidateLayout layout,
                                         const std::function<const torchfile::TorchFile*()>& open_meta);

}  // namespace shardpoint::engine
