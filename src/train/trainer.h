// Trainer: Lightning's Trainer.fit for the demo language model on FSDPStrategy, SPMD (every
// rank of the communicator runs fit()).
//
// fit(model, data, ckpt_path), all ranks:
//   1. init the full parameters from the seed (same on every rank), keep this rank's dim-0
//      pieces (FSDPStrategy::setup);
//   2. rank 0 picks <root>/lightning_logs/version_<k>/checkpoints (k = 1 + the largest
//      existing version, or 0) and broadcasts it;
//   3. with ckpt_path: rank 0 classifies it by Lightning's rule (a folder holding meta.pt is
//      sharded, a regular file is full, anything else is an error on every rank), then every
//      rank loads its pieces of "model" and "optimizer_0" (any saved world size, either
//      format) and the loop position from meta.pt / the file;
//   4. steps global_step .. max_steps-1 (run_step), rank 0 printing step, loss, tokens/s;
//   5. saves epoch=<e>-step=<s>.ckpt in the checkpoints folder at the end (Lightning's
//      ModelCheckpoint defaults with max_steps: one checkpoint when training stops):
//      "sharded": a DCP folder with keys "model" and "optimizer_0" (engine::save, all ranks)
//      then meta.pt written last by rank 0 (tmp + rename) with epoch, global_step,
//      pytorch-lightning_version, loops, callbacks (ModelCheckpoint state under its Lightning
//      key), lr_schedulers ([]) and "shardpoint" (seed, global batch, model size, data
//      position, RNG scheme); "full": rank 0 writes one torch.save file with the same keys
//      plus state_dict and optimizer_states.
// Exact resume: the data position is global_step * global_batch items, and dropout draws
// from a generator seeded by (seed, global item position), so there is no hidden RNG state
// to carry: a resumed run on the same world size is bitwise equal to an uninterrupted one,
// and on another world size equal up to the order of the gradient sums.
// Known gaps: the full file's optimizer "state" is keyed by FQN (Lightning rekeys it to
// parameter ids); no every_n_train_steps / save_top_k / save_last / "last"; max_epochs,
// gradient accumulation and clipping are not implemented.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "train/data.h"
#include "train/fsdp_strategy.h"
#include "train/model.h"
#include "train/sharded_optimizer.h"

namespace shardpoint::train {

// The version Lightning 2.6.2 (master) writes.
inline constexpr const char* kLightningVersion = "2.6.2";

struct TrainerOptions {
  std::int64_t max_steps = 3;
  std::string default_root_dir = ".";
  std::uint64_t seed = 0;
  // Data items (35-token blocks) per optimizer step across all ranks; rank r of W takes
  // every W-th. Fixed for a run (a resume keeps the checkpoint's value).
  std::int64_t global_batch = 4;
  std::string model_size = "tiny";  // recorded in meta.pt
  OptimizerConfig optimizer;
  bool progress = true;  // rank 0 prints one line per step and per checkpoint
};

struct FitResult {
  std::vector<double> losses;       // mean token NLL of each step run here
  std::string checkpoint_path;      // the checkpoint saved at the end
  std::int64_t start_step = 0;      // global_step after loading ckpt_path
  double load_seconds = 0;
  double save_seconds = 0;
  std::uint64_t checkpoint_bytes = 0;  // this rank's bytes ("full": rank 0's file)
};

// Mean NLL per token of one step: all-gather, forward/backward over this rank's items,
// reduce-scatter, optimizer step on the pieces. (all ranks)
double run_step(FSDPStrategy& strategy, ShardedOptimizer& optimizer, const ModelConfig& model,
                const TextCorpus& data, std::int64_t step, std::int64_t global_batch, std::uint64_t seed);

class Trainer {
 public:
  Trainer(TrainerOptions options, FSDPStrategy strategy);

  // (all ranks) See the top comment. ckpt_path "" starts from scratch. Throws UsageError for
  // a ckpt_path that is neither a full file nor a sharded folder (on every rank), PlanError
  // when the checkpoint does not fit the model, what save/load throw otherwise.
  FitResult fit(comm::Communicator& comm, const ModelConfig& model, const TextCorpus& data,
                const std::string& ckpt_path = "");

  FSDPStrategy& strategy() { return strategy_; }
  ShardedOptimizer& optimizer() { return *optimizer_; }

 private:
  TrainerOptions options_;
  FSDPStrategy strategy_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
};

}  // namespace shardpoint::train
