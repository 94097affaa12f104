// The checkpoint dict Lightning's consolidation writes, as edits of an unpickled top-level
// dict's entries (docs/lightning-layout.md §4.4): meta.pt merged over the DCP state,
// then, for a Trainer checkpoint, the module state moved to "state_dict" and the
// optimizer_<i> entries gathered into "optimizer_states". Keys are matched as str keys;
// other keys are left where they are. Which key holds the module state depends on the
// strategy that saved the checkpoint (LightningLayout, lightning-layout.md §2).
//
// Thread-safety: pure functions of their arguments; no shared state.
#pragma once

#include <optional>
#include <string>

#include "shardpoint/metadata.h"
#include "shardpoint/pickle_value.h"

namespace shardpoint::engine {

// The strategy family that saved a Lightning sharded checkpoint, told by the top-level DCP
// key holding the module state (lightning-layout.md §2).
enum class LightningLayout {
  kFsdp,           // FSDPStrategy (and shardpoint's trainer): "model"
  kModelParallel,  // ModelParallelStrategy (FSDP2 / tensor parallel): "state_dict"
};

// The top-level DCP key of the module state: "model" or "state_dict".
const char* model_key(LightningLayout layout);

// The layout of a DCP checkpoint, from the first element of its items' nesting paths
// (planner_data; an item without one counts by its fqn): kFsdp when some item lies under
// "model" (Lightning's consolidation takes "model" when both are there), else
// kModelParallel when some item lies under "state_dict", else nullopt (not a Lightning
// Trainer checkpoint).
std::optional<LightningLayout> lightning_layout_of(const format::Metadata& md);

// lightning_layout_of(), or PlanError naming both keys when it is nullopt (Lightning's
// consolidation raises KeyError: 'model' there).
LightningLayout require_lightning_layout(const format::Metadata& md);

// Python's dict.update(other) on entries: a str key of `other` already present replaces
// that entry's value in place, other entries are appended in other's order.
// REQUIRES other is a dict.
void merge_dict_update(pickle::DictEntries& entries, const pickle::Value& other);

// Lightning's _format_checkpoint: model_key(layout) popped and re-added at the end as
// "state_dict" (kModelParallel: "state_dict" moves to the end, as it would if Lightning's
// tool took the key it saved under); then the N keys matching the prefix regex
// `optimizer_[0-9]+` popped as optimizer_0 .. optimizer_{N-1} into a list
// "optimizer_states" at the end (nothing when N is 0). The optimizer states keep their
// parameter-name keys, which Lightning's full-checkpoint loaders accept: ModelParallel's
// keeps names, a single-device optimizer maps them by position. Throws PlanError (Lightning
// raises KeyError) when the model key is missing or an index in 0..N-1 is; entries may then
// be partly edited.
void apply_trainer_layout(pickle::DictEntries& entries, LightningLayout layout);

}  // namespace shardpoint::engine
