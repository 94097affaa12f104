// ModelCheckpoint: Lightning's checkpoint callback (docs/lightning-layout.md §5), its
// bookkeeping only: when to save, under which name, which older checkpoint to remove after
// the new one is committed, and the state it records in every checkpoint ("callbacks").
// The Trainer does the I/O through CheckpointActions; every rank runs the same decisions on
// the same inputs (the monitored loss is all-reduced), so the collective saves line up.
//
// Lightning's rules, as implemented:
//   - triggers: with neither every_n_train_steps nor every_n_epochs set, every_n_epochs = 1;
//     setting one makes the other 0; both >= 1 is a UsageError (mutually exclusive);
//   - on_train_batch_end: when every_n_train_steps >= 1 and global_step % n == 0, a top-k
//     save then a last save;
//   - on_train_epoch_end (also when max_steps stops an epoch early): when every_n_epochs >= 1
//     and (epoch + 1) % n == 0 a top-k save; a last save in any case;
//   - nothing is saved twice for one global_step, nor at global_step 0;
//   - top-k without a monitor (save_top_k in -1, 0, 1): save epoch=<e>-step=<s>.ckpt, then
//     with save_top_k 1 remove the previous one; with a monitor: save when fewer than k are
//     kept or the score beats the k-th best (mode min: lower), then remove the one it
//     displaced; NaN scores count as +inf (min) / -inf (max);
//   - save_last: last.ckpt, a full second save (not a link); the previous last is removed;
//   - a name already taken (and not the one being replaced) gets -v1, -v2, ...;
//   - a checkpoint is removed only when it is not the new one, not the one this run resumed
//     from, and lies inside dirpath (Lightning's local rule, applied to URLs too: a resumed
//     run never deletes another version folder's checkpoints).
// State restored on resume: none (Lightning keeps only best_model_path when dirpath
// changed, and a resumed run always writes into a new version folder).
// Thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace shardpoint::train {

struct ModelCheckpointOptions {
  std::int64_t every_n_train_steps = 0;  // 0: not set
  std::int64_t every_n_epochs = -1;      // -1: not set (Lightning's None)
  std::int64_t save_top_k = 1;           // -1 keeps every checkpoint, 0 none
  bool save_last = false;
  std::string monitor;       // "" (none) or "train_loss"
  std::string mode = "min";  // "min" or "max"
};

// Where the monitored quantities stand when a hook runs.
struct TrainPosition {
  std::int64_t epoch = 0;        // the epoch of the step just run (Lightning's current_epoch)
  std::int64_t global_step = 0;  // optimizer steps done
  double train_loss = 0;         // the step's mean token loss over all ranks
};

// The I/O a hook asks for, in order. save and exists are collectives (all ranks); remove is
// called on every rank too and acts on rank 0 only.
struct CheckpointActions {
  std::function<bool(const std::string& path)> exists;
  std::function<void(const std::string& path)> save;
  std::function<void(const std::string& path)> remove;
};

class ModelCheckpoint {
 public:
  // Throws UsageError for an invalid combination, with Lightning's wording.
  explicit ModelCheckpoint(ModelCheckpointOptions options);

  // Lightning's callbacks key: ModelCheckpoint{'monitor': None, 'mode': 'min', ...}.
  std::string state_key() const;

  // dirpath: the checkpoints folder (absolute path or URL, no trailing '/'); resume_path:
  // the checkpoint this run loaded ("" if none), never removed.
  void set_paths(std::string dirpath, std::string resume_path);

  void on_train_batch_end(const TrainPosition& p, const CheckpointActions& io);
  void on_train_epoch_end(const TrainPosition& p, const CheckpointActions& io);

  // The state Lightning saves (docs/lightning-layout.md §3.3). Scores are float32 values.
  const std::string& monitor() const { return options_.monitor; }
  const std::optional<float>& best_model_score() const { return best_model_score_; }
  const std::string& best_model_path() const { return best_model_path_; }
  const std::optional<float>& current_score() const { return current_score_; }
  const std::string& dirpath() const { return dirpath_; }
  const std::vector<std::pair<std::string, float>>& best_k_models() const { return best_k_models_; }
  const std::string& kth_best_model_path() const { return kth_best_model_path_; }
  float kth_value() const { return kth_value_; }
  const std::string& last_model_path() const { return last_model_path_; }

  // The paths saved by this callback so far, in order (a path may repeat: last.ckpt).
  const std::vector<std::string>& saved() const { return saved_; }

 private:
  std::string name(const TrainPosition& p, bool last, int version) const;
  std::string free_name(const TrainPosition& p, bool last, const std::string& replacing,
                        const CheckpointActions& io) const;
  void save(const std::string& path, const TrainPosition& p, const CheckpointActions& io);
  void remove_if_allowed(const std::string& previous, const std::string& current, const CheckpointActions& io);
  void save_top_k(const TrainPosition& p, const CheckpointActions& io);
  void save_last(const TrainPosition& p, const CheckpointActions& io);
  bool better(float a, float b) const { return options_.mode == "min" ? a < b : a > b; }

  ModelCheckpointOptions options_;
  std::int64_t every_n_train_steps_ = 0;
  std::int64_t every_n_epochs_ = 1;
  std::string dirpath_;
  std::string resume_path_;
  std::int64_t last_global_step_saved_ = 0;
  std::optional<float> best_model_score_;
  std::string best_model_path_;
  std::optional<float> current_score_;
  std::vector<std::pair<std::string, float>> best_k_models_;  // insertion order, like the dict
  std::string kth_best_model_path_;
  float kth_value_;
  std::string last_model_path_;
  std::vector<std::string> saved_;
};

}  // namespace shardpoint::train
