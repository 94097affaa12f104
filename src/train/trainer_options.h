// TrainerOptions: what a Trainer run is asked to do (steps, data, optimizer, checkpoints),
// apart from the Trainer, so that what builds checkpoint contents from them
// (lightning_checkpoint.h) does not depend on the Trainer that calls it.
//
// Plain values; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "shardpoint/location.h"
#include "train/model_checkpoint.h"
#include "train/sharded_optimizer.h"

namespace shardpoint::train {

// The Lightning release whose checkpoint layout meta.pt mirrors (its pytorch-lightning_version).
inline constexpr const char* kLightningVersion = "2.6.6";

struct TrainerOptions {
  // Training stops when global_step reaches max_steps or the epoch reaches max_epochs; -1
  // means no limit. Both -1: max_epochs 1000 (Lightning's default).
  std::int64_t max_steps = 3;
  std::int64_t max_epochs = -1;
  Location default_root_dir;  // a local path (default ".") or a URL
  std::uint64_t seed = 0;
  // Data items (35-token blocks) per optimizer step across all ranks; rank r of W takes
  // every W-th. Fixed for a run (a resume keeps the checkpoint's value).
  std::int64_t global_batch = 4;
  // Batches per optimizer step (gradients summed; the loss scaled by 1/k as Lightning does,
  // also for an epoch's shorter last step). Fixed for a run like global_batch.
  std::int64_t accumulate_grad_batches = 1;
  // Clip the global gradient norm (2-norm over all parameters, all ranks) to this value
  // before each optimizer step; 0 = off.
  double gradient_clip_val = 0;
  std::string model_size = "tiny";  // recorded in meta.pt
  OptimizerConfig optimizer;
  ModelCheckpointOptions checkpoint;
  bool progress = true;  // rank 0 prints one line per step and per checkpoint
  // Sharded checkpoints are written in the background (see the top comment); training
  // stalls only for planning and one copy of this rank's bytes into staging memory, kept
  // between saves. Ignored for "full" checkpoints (gathered on rank 0, saved in place).
  bool async_save = false;
};

}  // namespace shardpoint::train
