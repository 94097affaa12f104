#include "train/model_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "shardpoint/error.h"

namespace shardpoint::train {

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  const ModelCheckpointOptions& o = options_;
  if (o.save_top_k < -1) throw UsageError(fmt::format("Invalid value for save_top_k={}. Must be >= -1", o.save_top_k));
  if (o.every_n_train_steps < 0) {
    throw UsageError(fmt::format("Invalid value for every_n_train_steps={}. Must be >= 0", o.every_n_train_steps));
  }
  if (o.every_n_epochs < -1)
    throw UsageError(fmt::format("Invalid value for every_n_epochs={}. Must be >= 0", o.every_n_epochs));
  if (o.mode != "min" && o.mode != "max")
    throw UsageError(fmt::format("`mode` can be \"min\" or \"max\", got {}", o.mode));
  if (!o.monitor.empty() && o.monitor != "train_loss") {
    throw UsageError(fmt::format(
        "`ModelCheckpoint(monitor='{}')` could not find the monitored key in the returned metrics: ['train_loss']",
        o.monitor));
  }
  if (o.monitor.empty() && o.save_top_k != -1 && o.save_top_k != 0 && o.save_top_k != 1) {
    throw UsageError(fmt::format(
        "ModelCheckpoint(save_top_k={}, monitor=None) is not a valid configuration. No quantity for top_k to track.",
        o.save_top_k));
  }
  if (o.every_n_train_steps == 0 && o.every_n_epochs == -1) {
    every_n_train_steps_ = 0;
    every_n_epochs_ = 1;
  } else {
    every_n_train_steps_ = o.every_n_train_steps;
    every_n_epochs_ = std::max<std::int64_t>(o.every_n_epochs, 0);
  }
  if (every_n_train_steps_ >= 1 && every_n_epochs_ >= 1) {
    throw UsageError(fmt::format(
        "Combination of parameters every_n_train_steps={}, every_n_epochs={} and train_time_interval=None should be "
        "mutually exclusive.",
        every_n_train_steps_, every_n_epochs_));
  }
  kth_value_ = o.mode == "min" ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
}

std::string ModelCheckpoint::state_key() const {
  const std::string monitor = options_.monitor.empty() ? "None" : fmt::format("'{}'", options_.monitor);
  return fmt::format("ModelCheckpoint{{'monitor': {}, 'mode': '{}', 'every_n_train_steps': {}, 'every_n_epochs': {}, "
                     "'train_time_interval': None}}",
                     monitor, options_.mode, every_n_train_steps_, every_n_epochs_);
}

void ModelCheckpoint::set_paths(Location dirpath, std::optional<Location> resume_path) {
  dirpath_ = std::move(dirpath);
  resume_path_ = std::move(resume_path);
}

Location ModelCheckpoint::name(const TrainPosition& p, bool last, int version) const {
  std::string stem = last ? "last" : fmt::format("epoch={}-step={}", p.epoch, p.global_step);
  if (version > 0) stem += fmt::format("-v{}", version);
  return dirpath_.child(stem + ".ckpt");
}

Location ModelCheckpoint::free_name(const TrainPosition& p, bool last, const std::optional<Location>& replacing,
                                    const CheckpointActions& io) const {
  Location path = name(p, last, 0);
  for (int version = 1; path != replacing && io.exists(path); ++version) path = name(p, last, version);
  return path;
}

void ModelCheckpoint::save(const Location& path, const TrainPosition& p, const CheckpointActions& io) {
  io.save(path);
  last_global_step_saved_ = p.global_step;
  saved_.push_back(path);
}

void ModelCheckpoint::remove_if_allowed(const std::optional<Location>& previous, const Location& current,
                                        const CheckpointActions& io) {
  if (!previous || *previous == current || previous == resume_path_) return;
  bool inside = false;  // Lightning removes only what lies under dirpath
  for (std::optional<Location> up = previous->parent(); up && !inside; up = up->parent()) inside = *up == dirpath_;
  if (inside) io.remove(*previous);
}

void ModelCheckpoint::on_train_batch_end(const TrainPosition& p, const CheckpointActions& io) {
  if (p.global_step == last_global_step_saved_) return;
  if (every_n_train_steps_ < 1 || p.global_step % every_n_train_steps_ != 0) return;
  save_top_k(p, io);
  save_last(p, io);
}

void ModelCheckpoint::on_train_epoch_end(const TrainPosition& p, const CheckpointActions& io) {
  if (p.global_step == last_global_step_saved_) return;
  if (every_n_epochs_ >= 1 && (p.epoch + 1) % every_n_epochs_ == 0) save_top_k(p, io);
  save_last(p, io);
}

void ModelCheckpoint::save_top_k(const TrainPosition& p, const CheckpointActions& io) {
  const std::int64_t top_k = options_.save_top_k;
  if (top_k == 0) return;
  if (options_.monitor.empty()) {
    const Location path = free_name(p, false, best_model_path_, io);
    const std::optional<Location> previous = best_model_path_;
    best_model_path_ = path;
    save(path, p, io);
    if (top_k == 1) remove_if_allowed(previous, path, io);
    return;
  }
  float current = static_cast<float>(p.train_loss);
  auto score_of = [this](const std::optional<Location>& path) {
    for (const auto& [k, v] : best_k_models_) {
      if (k == path) return v;
    }
    return kth_value_;
  };
  const bool room = top_k == -1 || static_cast<std::int64_t>(best_k_models_.size()) < top_k;
  if (!room && !better(current, score_of(kth_best_model_path_))) return;
  const std::size_t k = top_k == -1 ? best_k_models_.size() + 1 : static_cast<std::size_t>(top_k);
  std::optional<Location> displaced;
  if (best_k_models_.size() == k) {
    displaced = kth_best_model_path_;
    std::erase_if(best_k_models_, [&](const auto& e) { return e.first == displaced; });
  }
  if (std::isnan(current))
    current = options_.mode == "min" ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  const Location path = free_name(p, false, displaced, io);
  current_score_ = current;
  auto it = std::find_if(best_k_models_.begin(), best_k_models_.end(), [&](const auto& e) { return e.first == path; });
  if (it != best_k_models_.end()) it->second = current;
  else best_k_models_.emplace_back(path, current);
  // Python's max/min over a dict: the first entry wins a tie.
  auto pick = [&](bool worst) {
    auto best = best_k_models_.begin();
    for (auto e = best_k_models_.begin(); e != best_k_models_.end(); ++e) {
      if (worst ? better(best->second, e->second) : better(e->second, best->second)) best = e;
    }
    return *best;
  };
  if (best_k_models_.size() == k) std::tie(kth_best_model_path_, kth_value_) = pick(true);
  const auto [best_path, best_score] = pick(false);
  best_model_path_ = best_path;
  best_model_score_ = best_score;
  save(path, p, io);
  if (displaced) remove_if_allowed(displaced, path, io);
}

void ModelCheckpoint::save_last(const TrainPosition& p, const CheckpointActions& io) {
  if (!options_.save_last) return;
  const Location path = free_name(p, true, last_model_path_, io);
  const std::optional<Location> previous = last_model_path_;
  last_model_path_ = path;  // before saving: it is part of the saved state
  save(path, p, io);
  remove_if_allowed(previous, path, io);
}

}  // namespace shardpoint::train
