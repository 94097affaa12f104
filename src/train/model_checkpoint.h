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

#include "shardpoint/location.h"

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
  std::function<bool(const Location& path)> exists;
  std::function<void(const Location& path)> save;
  std::function<void(const Location& path)> remove;
};

class ModelCheckpoint {
 public:
  // Throws UsageError for an invalid combination, with Lightning's wording.
  explicit ModelCheckpoint(ModelCheckpointOptions options);

  // Lightning's callbacks key: ModelCheckpoint{'monitor': None, 'mode': 'min', ...}.
  std::string state_key() const;

  // dirpath: the checkpoints folder (an absolute path or a URL); resume_path: the
  // checkpoint this run loaded (none: nullopt), never removed.
  void set_paths(Location dirpath, std::optional<Location> resume_path);

  void on_train_batch_end(const TrainPosition& p, const CheckpointActions& io);
  void on_train_epoch_end(const TrainPosition& p, const CheckpointActions& io);

  // The state Lightning saves (docs/lightning-layout.md §3.3), paths as Lightning's strings
  // ("" for none). Scores are float32 values.
  const std::string& monitor() const { return options_.monitor; }
  const std::optional<float>& best_model_score() const { return best_model_score_; }
  std::string best_model_path() const { return text_of(best_model_path_); }
  const std::optional<float>& current_score() const { return current_score_; }
  const Location& dirpath() const { return dirpath_; }
  const std::vector<std::pair<Location, float>>& best_k_models() const { return best_k_models_; }
  std::string kth_best_model_path() const { return text_of(kth_best_model_path_); }
  float kth_value() const { return kth_value_; }
  std::string last_model_path() const { return text_of(last_model_path_); }

  // The paths saved by this callback so far, in order (a path may repeat: last.ckpt).
  const std::vector<Location>& saved() const { return saved_; }

 private:
  static std::string text_of(const std::optional<Location>& path) { return path ? path->to_string() : ""; }
  Location name(const TrainPosition& p, bool last, int version) const;
  Location free_name(const TrainPosition& p, bool last, const std::optional<Location>& replacing,
                     const CheckpointActions& io) const;
  void save(const Location& path, const TrainPosition& p, const CheckpointActions& io);
  void remove_if_allowed(const std::optional<Location>& previous, const Location& current, const CheckpointActions& io);
  void save_top_k(const TrainPosition& p, const CheckpointActions& io);
  void save_last(const TrainPosition& p, const CheckpointActions& io);
  bool better(float a, float b) const { return options_.mode == "min" ? a < b : a > b; }

  ModelCheckpointOptions options_;
  std::int64_t every_n_train_steps_ = 0;
  std::int64_t every_n_epochs_ = 1;
  Location dirpath_;
  std::optional<Location> resume_path_;
  std::int64_t last_global_step_saved_ = 0;
  std::optional<float> best_model_score_;
  std::optional<Location> best_model_path_;
  std::optional<float> current_score_;
  std::vector<std::pair<Location, float>> best_k_models_;  // insertion order, like the dict
  std::optional<Location> kth_best_model_path_;
  float kth_value_;
  std::optional<Location> last_model_path_;
  std::vector<Location> saved_;
};

}  // namespace shardpoint::train
