// The checkpoint dict Lightning's consolidation writes, as edits of an unpickled top-level
// dict's entries (docs/lightning-layout.md §4.4): meta.pt merged over the DCP state,
// then, for a Trainer checkpoint, "model" renamed "state_dict" and the optimizer_<i>
// entries gathered into "optimizer_states". Keys are matched as str keys; other keys are
// left where they are.
//
// Thread-safety: pure edits of the caller's entries; no shared state.
#pragma once

#include "shardpoint/pickle_value.h"

namespace shardpoint::engine {

// Python's dict.update(other) on entries: a str key of `other` already present replaces
// that entry's value in place, other entries are appended in other's order.
// REQUIRES other is a dict.
void merge_dict_update(pickle::DictEntries& entries, const pickle::Value& other);

// Lightning's _format_checkpoint: "model" popped and re-added at the end as "state_dict";
// then the N keys matching the prefix regex `optimizer_[0-9]+` popped as optimizer_0 ..
// optimizer_{N-1} into a list "optimizer_states" at the end (nothing when N is 0).
// Throws PlanError (Lightning raises KeyError) when "model" is missing or an index in
// 0..N-1 is; entries may then be partly edited.
void apply_trainer_layout(pickle::DictEntries& entries);

}  // namespace shardpoint::engine
