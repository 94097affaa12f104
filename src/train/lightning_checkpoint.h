// The contents of the trainer's checkpoints, as Lightning 2.x writes them, built as pickle
// trees (docs/lightning-layout.md §3): the meta entries (epoch, global_step, version,
// the loops' progress counters, the ModelCheckpoint callback state, lr_schedulers, and
// shardpoint's resume data), meta.pt of a sharded checkpoint, and the whole torch.save file
// of a full checkpoint. Where they are written and when is Trainer's business.
//
// Thread-safety: pure functions of their arguments; a TorchFileBuilder is used by one
// thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardpoint/pickle_value.h"
#include "shardpoint/state_dict.h"
#include "train/data.h"
#include "train/model_checkpoint.h"
#include "train/trainer_options.h"

namespace shardpoint::train {

// Where the loops stand when a checkpoint is saved (docs/lightning-layout.md §3.3).
struct LoopState {
  std::int64_t epoch = 0;  // current_epoch (the epoch of the last step run)
  std::int64_t global_step = 0;
  std::int64_t batches_total = 0;  // batches run since the start of training
  std::int64_t batches_in_epoch = 0;
  std::int64_t steps_in_epoch = 0;
  bool is_last_batch = false;    // the epoch's data is exhausted
  bool epoch_processed = false;  // saved from on_train_epoch_end
};

// Builds a torch.save archive from a pickle tree whose tensor nodes it made (so dict keys
// may be ints, as a full checkpoint's optimizer state needs). Keeps the tensors alive.
class TorchFileBuilder {
 public:
  // A tensor node for a contiguous copy of t (storage key: the next index).
  pickle::ValuePtr tensor(const at::Tensor& t);
  // A 0-dim float32 tensor node.
  pickle::ValuePtr scalar(float v);
  // The archive: root's pickle, then the storages of every tensor made, in order.
  std::string bytes(const pickle::Value& root);

 private:
  std::vector<at::Tensor> tensors_;
};

// Lightning's checkpoint dict minus state_dict and optimizer_states, as pickle values in its
// order: epoch, global_step, pytorch-lightning_version, loops, callbacks, lr_schedulers; then
// shardpoint's own resume data. Tensors (callback scores) are made by `files`.
pickle::DictEntries meta_entries(const TrainerOptions& o, const ModelCheckpoint& mc, const LoopState& loops,
                                 const DataSchedule& schedule, TorchFileBuilder& files);

// meta.pt of a sharded checkpoint: the meta entries alone, as torch.save bytes.
std::string meta_pt_bytes(const TrainerOptions& o, const ModelCheckpoint& mc, const LoopState& loops,
                          const DataSchedule& schedule);

// Lightning's full checkpoint as torch.save bytes: the meta entries with state_dict after
// the first three and optimizer_states before lr_schedulers (dump order); the optimizer
// state keyed by parameter id and param_groups listing ids, as Lightning rekeys a full FSDP
// optimizer state. REQUIRES names and params align; meta holds "lr_schedulers".
std::string full_checkpoint_bytes(pickle::DictEntries meta, const std::vector<std::string>& names,
                                  const std::vector<at::Tensor>& params,
                                  const std::map<std::string, std::map<std::string, at::Tensor>>& optimizer_state,
                                  const engine::StateNode& param_group, TorchFileBuilder& files);

}  // namespace shardpoint::train
