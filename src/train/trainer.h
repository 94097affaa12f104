// Trainer: Lightning's Trainer.fit for the demo language model on FSDPStrategy, SPMD (every
// rank of the communicator runs fit()).
//
// fit(model, data, ckpt_path), all ranks:
//   1. init the full parameters from the seed (same on every rank), keep this rank's dim-0
//      pieces (FSDPStrategy::setup);
//   2. rank 0 picks <root>/lightning_logs/version_<k>/checkpoints (k = 1 + the largest
//      existing version, or 0) and broadcasts it. Nothing is created until the first
//      checkpoint is saved (Lightning creates it lazily), so a run that fails or saves
//      nothing leaves no folder behind. root may be a local path or an object-store URL
//      (s3://, gs://, az://; everything goes through storage/);
//   3. with ckpt_path: rank 0 resolves "last" (see resolve_last_checkpoint) and classifies
//      the path by Lightning's rule (a folder holding meta.pt is sharded, an object/regular
//      file is full, anything else is an error on every rank), broadcasts it, then every
//      rank loads its pieces of "model" and "optimizer_0" (any saved world size, either
//      format; full-file optimizer state keyed by parameter id or FQN) and the loop position
//      (global_step; global_batch and accumulate_grad_batches are the checkpoint's);
//   4. runs optimizer steps (run_step) until max_steps or max_epochs (DataSchedule: epoch
//      boundaries, accumulation), rank 0 printing step, loss, tokens/s; after each step the
//      ModelCheckpoint hooks run (on_train_batch_end, and on_train_epoch_end at an epoch's
//      last step or when max_steps stops the epoch), which save through save_checkpoint()
//      and remove superseded checkpoints only after the new one is committed. A local
//      sharded checkpoint is written in a hidden sibling (.<name>.sp-replace-<step>) and
//      swapped in once committed (renameat2 RENAME_EXCHANGE, then the replaced one is
//      removed), so replacing last.ckpt or any other committed checkpoint never leaves a
//      moment with neither committed; each save first removes what killed saves left
//      (remove_stale_staging; the first save of a fit in every version folder).
//      docs/durability.md has the protocol, the object-store scheme and the kill -9 matrix;
//   5. save_checkpoint(path) writes one checkpoint, Lightning's layout and content:
//      "sharded": a DCP folder with keys "model" and "optimizer_0" (engine::save, all ranks)
//      then meta.pt written last by rank 0 (atomic publish: the commit marker) with epoch,
//      global_step, pytorch-lightning_version, loops, callbacks (ModelCheckpoint state under
//      its Lightning key), lr_schedulers ([]) and "shardpoint" (seed, global batch,
//      accumulation, model size, data position, RNG scheme); "full": gathered on rank 0
//      into one torch.save file with the same keys plus state_dict and optimizer_states,
//      whose "state" is keyed by integer parameter ids and param_groups "params" lists ints,
//      as Lightning's full checkpoints are (the sharded one keys by FQN).
//      With async_save a sharded save returns after planning and staging this rank's bytes
//      (engine::async_save); the files are written in the background and the save is
//      committed (PendingSave::wait, then rank 0 writes meta.pt, built at save time) at the
//      next save, the next exists-check or removal that concerns it, or the end of fit
//      (also when fit throws). Removals of superseded checkpoints wait for that commit.
// The monitored metric "train_loss" is the step's mean token NLL over all ranks and all
// accumulated batches: what `self.log("train_loss", loss, sync_dist=True)` logs without
// accumulation (with it, Lightning would log the last batch's loss only).
// Exact resume: the data position is a function of global_step (DataSchedule), and dropout
// draws from a generator seeded by (seed, position of the item in the run), so there is no
// hidden RNG state to carry: a resumed run on the same world size is bitwise equal to an
// uninterrupted one (accumulation and clipping included), and on another world size equal
// up to the order of the gradient sums.
// Known gaps: save_last="link", train_time_interval, save_weights_only, validation loops and
// learning-rate schedulers do not exist; the only metric to monitor is train_loss; the
// ModelCheckpoint state is not restored on resume (Lightning restores only best_model_path
// when the folder changed, which it always does here); "last" searches every version folder
// under the root and orders by version then -v<n>, not by modification time (Lightning looks
// only in the new run's folder, where the default logger finds nothing); a resume keeps the
// checkpoint's global_batch and accumulate_grad_batches whatever the options say (the data
// position depends on them); gradient clipping is by norm only (Lightning's FSDP refuses
// "value"), the norm computed in double; the full file is built in memory on rank 0.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardpoint/async_save.h"
#include "shardpoint/communicator.h"
#include "shardpoint/storage.h"
#include "train/checkpoint_paths.h"  // resolve_last_checkpoint(), used by fit()
#include "train/data.h"
#include "train/fsdp_strategy.h"
#include "train/model.h"
#include "train/model_checkpoint.h"
#include "train/sharded_optimizer.h"
#include "train/trainer_options.h"

namespace shardpoint::train {

struct FitResult {
  std::vector<double> losses;      // mean token NLL of each step run here
  std::string checkpoint_path;     // the last checkpoint saved ("" if none)
  std::vector<std::string> saved;  // every checkpoint saved, in order
  std::string best_model_path;     // ModelCheckpoint's best_model_path
  std::string resumed_from;        // the resolved ckpt_path ("" if none)
  std::int64_t start_step = 0;     // global_step after loading ckpt_path
  double load_seconds = 0;
  double save_seconds = 0;             // of the last checkpoint (async_save: the training stall)
  std::uint64_t checkpoint_bytes = 0;  // this rank's bytes of the last one ("full": rank 0's file)
};

// One optimizer step: all-gather, forward/backward over this rank's items of the step's
// batches (gradients accumulate), reduce-scatter, optional norm clipping, optimizer step on
// the pieces. Returns the mean NLL per token over all ranks. (all ranks)
struct StepResult {
  double loss = 0;
  double grad_norm = 0;  // before clipping
};
StepResult run_step(FSDPStrategy& strategy, ShardedOptimizer& optimizer, const ModelConfig& model,
                    const TextCorpus& data, const DataSchedule& schedule, std::int64_t step, std::uint64_t seed,
                    double gradient_clip_val = 0);

class Trainer {
 public:
  Trainer(TrainerOptions options, FSDPStrategy strategy);

  // (all ranks) See the top comment. ckpt_path "" starts from scratch; "last" resumes from
  // resolve_last_checkpoint(root) (rank 0 prints its note, one line, when it passed over the
  // newest last*.ckpt), or starts from scratch with a warning when the root holds no
  // committed checkpoint.
  // Throws UsageError for a ckpt_path that is neither a full file nor a sharded folder (on
  // every rank), PlanError when the checkpoint does not fit the model, what save/load throw
  // otherwise.
  FitResult fit(comm::Communicator& comm, const ModelConfig& model, const TextCorpus& data,
                const std::string& ckpt_path = "");

  // (all ranks) Writes one checkpoint of the current state at path (a local path or URL)
  // in the strategy's state_dict_type; returns when it is committed on every rank (meta.pt
  // or the full file published), or with async_save and "sharded" once this rank's bytes
  // are staged (finish_pending() commits it). The one place a checkpoint is written; it
  // first commits the save in flight. Updates result's save_seconds and checkpoint_bytes.
  void save_checkpoint(const Location& path, FitResult& result);

  // (all ranks) Commits the async save in flight, if any: waits for every rank's writes,
  // commits .metadata, then rank 0 writes its meta.pt (the trainer's commit marker) and
  // removes the checkpoints it superseded. Throws the save's errors on every rank (then
  // nothing is committed nor removed, and the staging folder is removed).
  void finish_pending(FitResult& result);

  FSDPStrategy& strategy() { return strategy_; }
  ShardedOptimizer& optimizer() { return *optimizer_; }

 private:
  std::int64_t load_checkpoint(const Location& path);  // (all ranks) returns global_step
  void remove_checkpoint(const Location& path);        // (rank 0 acts) a superseded one
  // (rank 0) Swaps the committed folder written beside path into path and removes what it
  // replaced (storage::replace_local_folder); nothing when folder == path.
  void publish(const Location& folder, const Location& path);
  // (rank 0) remove_stale_staging() of dir (and, at the first save of a fit, of every local
  // version folder under the root); prints how many leftovers went.
  void remove_leftovers(const Location& dir);
  // (rank 0 acts) Removes the staging folder of a save that failed (a full disk, a lost
  // permission), best effort, so a failed save leaves nothing behind; nothing when
  // folder == path.
  void discard_staging(const Location& folder, const Location& path);

  TrainerOptions options_;
  FSDPStrategy strategy_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
  std::unique_ptr<ModelCheckpoint> checkpoint_;
  comm::Communicator* comm_ = nullptr;
  const TextCorpus* data_ = nullptr;
  DataSchedule schedule_;
  TrainPosition position_;               // after the last step run
  bool in_epoch_end_ = false;            // saving from on_train_epoch_end (loops: epoch processed)
  bool cleaned_other_versions_ = false;  // remove_leftovers() has cleaned every version folder

  // async_save: the save in flight. Declared so that pending_ is destroyed before the
  // storage and staging memory it uses.
  std::unique_ptr<engine::StagingPool> staging_;  // created by the first async save
  std::unique_ptr<storage::Storage> pending_storage_;
  std::unique_ptr<engine::PendingSave> pending_;
  std::optional<Location> pending_path_;
  Location pending_folder_;                 // where it is written (path, or its staging sibling)
  std::string pending_meta_;                // rank 0: meta.pt, written after the commit
  std::vector<Location> pending_removals_;  // superseded by pending_, removed after it
};

}  // namespace shardpoint::train
