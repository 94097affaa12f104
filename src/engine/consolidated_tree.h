// The object tree consolidate() writes with torch.save, built from a DCP checkpoint's
// .metadata (and meta.pt for the Lightning layouts) before any tensor data is read:
//   - the DCP state, nesting rebuilt from planner_data, keys in the given fqn order,
//     object items read whole (an object item that holds tensors is refused);
//   - kTrainer / kFabric: meta.pt merged on top and Lightning's layout applied
//     (engine/lightning_layout.h);
//   - every tensor a contiguous CPU tensor node whose storage key is "k", k counting in
//     the order the pickle writer meets them; tensors[k] says where its bytes are.
// DCP tensors get requires_grad false; meta.pt tensors keep requires_grad and Parameter-ness.
//
// Thread-safety: build_consolidated_tree() reads through the reader (thread-safe) and
// builds a new tree; the result belongs to the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/consolidate.h"
#include "shardpoint/dtype.h"
#include "shardpoint/metadata.h"
#include "shardpoint/pickle_value.h"
#include "torchfile/torch_file.h"

namespace shardpoint::engine {

// Where the bytes of one output tensor come from.
struct TensorSource {
  bool from_meta = false;
  std::string fqn;             // a DCP tensor (read by box)
  torchfile::TensorInfo meta;  // a meta.pt tensor (read whole)
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
// output order. open_meta: returns meta.pt (which must outlive the call); called once,
// after the DCP part is built, and only for kTrainer / kFabric. Throws FormatError (an
// object item holding tensors; meta.pt's root not a dict), PlanError (Lightning's
// KeyErrors, apply_trainer_layout()), and what reading an object item or open_meta throws.
ConsolidatedTree build_consolidated_tree(CheckpointReader& reader, const std::vector<std::string>& fqns,
                                         ConsolidateLayout layout,
                                         const std::function<const torchfile::TorchFile&()>& open_meta);

}  // namespace shardpoint::engine
