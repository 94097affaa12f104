#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "core/byte_stream.h"
#include "core/kill_point.h"
#include "engine/checkpoint_files.h"
#include "engine/torch_file_crc.h"
#include "engine/zip_crc_ledger.h"
#include "shardpoint/async_save.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "storage/local_replace.h"
#include "torch/tensor_adapter.h"
#include "torchfile/torch_file.h"
#include "torchfile/torch_save_writer.h"
#include "train/lightning_checkpoint.h"

namespace shardpoint::train {
namespace {

namespace fs = std::filesystem;
using pickle::Value;
using pickle::ValuePtr;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// splitmix64: the dropout seed of one data item of one run.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::int64_t meta_int(const Value& root, const char* key, const std::string& where) {
  ValuePtr v = root.get(key);
  if (!v) throw FormatError(fmt::format("{}: checkpoint has no \"{}\"", where, key));
  return v->as_int();
}

// Copies the whole tensor `info` of tf into out (row-major, little-endian) and checks the
// zip CRC-32 of its storage record: a contiguous little-endian tensor's bytes as they are
// read, any other's record whole first (its reads are element runs).
void read_checked(const torchfile::TorchFile& tf, const torchfile::TensorInfo& info, const std::string& what,
                  std::span<std::byte> out, engine::TorchFileCrc& crc) {
  if (info.is_contiguous() && !info.big_endian) {
    const std::uint64_t at =
        info.storage.offset + static_cast<std::uint64_t>(info.storage_offset) * dtype_itemsize(info.dtype);
    crc.read(info, what, at, out, what);
    return;
  }
  crc.check_storage(info, what);
  tf.read_tensor(info, out);
}

// Copies this rank's dim-0 piece of a full tensor stored in tf into dst.
void read_piece(const torchfile::TorchFile& tf, const Value& node, const std::string& what, const engine::Shape& shape,
                at::Tensor& dst, int rank, int world, engine::TorchFileCrc& crc) {
  const torchfile::TensorInfo* info = tf.tensor_of(node);
  if (!info) throw FormatError(fmt::format("{}: not a tensor", what));
  if (engine::Shape(info->shape.begin(), info->shape.end()) != shape || info->dtype != DType::kFloat32) {
    throw PlanError(fmt::format("{}: checkpoint has {} {}, the model needs float32 {}", what, dtype_name(info->dtype),
                                engine::shape_to_string(engine::Shape(info->shape.begin(), info->shape.end())),
                                engine::shape_to_string(shape)));
  }
  at::Tensor full = at::empty(std::vector<std::int64_t>(shape.begin(), shape.end()), at::kFloat);
  read_checked(tf, *info, what, std::span<std::byte>(static_cast<std::byte*>(full.data_ptr()), info->nbytes()), crc);
  dst.copy_(torchx::dim0_slice(full, rank, world));
}

// Runs fn on rank 0; every rank learns of a failure (no rank waits forever for rank 0).
template <typename Fn>
void on_rank0(comm::Communicator& comm, Fn&& fn) {
  std::exception_ptr error;
  if (comm.rank() == 0) {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  }
  comm.rethrow_if_any_failed(error);
}

}  // namespace

StepResult run_step(FSDPStrategy& strategy, ShardedOptimizer& optimizer, const ModelConfig& model,
                    const TextCorpus& data, const DataSchedule& schedule, std::int64_t step, std::uint64_t seed,
                    double gradient_clip_val) {
  comm::Communicator& comm = strategy.comm();
  const int rank = comm.rank(), world = comm.world_size();
  std::vector<at::Tensor> full = strategy.all_gather_params();
  const std::int64_t first = schedule.batches_before(step), count = schedule.batches_in_step(step);
  const std::int64_t batch_size = schedule.global_batch;
  double local = 0;
  std::vector<std::int64_t> in, tg;
  for (std::int64_t batch = first; batch < first + count; ++batch) {
    at::Tensor total;
    for (std::int64_t j = rank; j < batch_size; j += world) {
      const std::int64_t position = batch * batch_size + j;  // unique per item of the run
      data.item(schedule.item(batch, j), in, tg);
      at::Tensor inputs = at::tensor(in, at::kLong).view({1, kBlockSize});
      at::Tensor targets = at::tensor(tg, at::kLong).view({1, kBlockSize});
      at::Generator gen = at::detail::createCPUGenerator(mix(seed ^ mix(static_cast<std::uint64_t>(position))));
      at::Tensor loss = loss_sum(model, full, inputs, targets, true, gen);
      total = total.defined() ? total + loss : loss;
    }
    if (total.defined()) {
      local += total.item<double>();
      total.backward();  // gradients of the step's batches add up in the full parameters
    }
  }
  // Lightning divides each batch's loss by accumulate_grad_batches (also for a short last step).
  const double tokens_per_batch = static_cast<double>(batch_size * kBlockSize);
  std::vector<at::Tensor> grads =
      strategy.reduce_scatter_grads(full, 1.0 / (tokens_per_batch * static_cast<double>(schedule.accumulate)));
  StepResult r;
  if (gradient_clip_val > 0) {
    double squares = 0;
    for (const at::Tensor& g : grads) {
      if (g.numel() > 0) squares += g.to(at::kDouble).pow(2).sum().item<double>();
    }
    r.grad_norm = std::sqrt(comm.all_reduce(squares, comm::ReduceOp::kSum));
    const double coef = gradient_clip_val / (r.grad_norm + 1e-6);  // torch.nn.utils.clip_grad_norm_
    if (coef < 1) {
      for (at::Tensor& g : grads) g.mul_(static_cast<float>(coef));
    }
  }
  optimizer.step(strategy.local_params(), grads);
  r.loss = comm.all_reduce(local, comm::ReduceOp::kSum) / (tokens_per_batch * static_cast<double>(count));
  return r;
}

Trainer::Trainer(TrainerOptions options, FSDPStrategy strategy)
    : options_(std::move(options)), strategy_(std::move(strategy)) {}

std::int64_t Trainer::load_checkpoint(const Location& where) {
  const std::string& path = where.to_string();  // in messages
  comm::Communicator& comm = *comm_;
  const int rank = comm.rank(), world = comm.world_size();
  std::string found;  // rank 0's checkpoint_kind as its name, "" for neither
  on_rank0(comm, [&] {
    if (const auto k = checkpoint_kind(where)) found = std::string(state_dict_type_name(*k));
  });
  found = comm.broadcast(found);
  if (found.empty()) {
    throw UsageError(fmt::format(
        "The path '{}' does not point to a valid checkpoint. Make sure the path points to either a directory with "
        "FSDP checkpoint shards, or a single file with a full checkpoint.",
        path));
  }
  const auto t0 = Clock::now();
  const auto shapes = strategy_.global_shapes();
  const std::vector<std::string> names = strategy_.names();
  std::int64_t step = 0;
  auto read_loop_settings = [&](const Value& root) {
    step = meta_int(root, "global_step", path);
    if (auto sp = root.get("shardpoint")) {
      options_.global_batch = meta_int(*sp, "global_batch", path);
      if (sp->get("accumulate_grad_batches"))
        options_.accumulate_grad_batches = meta_int(*sp, "accumulate_grad_batches", path);
    }
  };
  std::exception_ptr error;
  const StateDictType kind = parse_state_dict_type(found);
  if (kind == StateDictType::kSharded) {
    engine::StateDict root;
    root.emplace_back("model", strategy_.model_state());
    root.emplace_back("optimizer_0", optimizer_->state_dict(shapes, rank, world));
    engine::StateNode state(std::move(root));
    engine::load(state, *storage::open_storage(where), comm);
    try {
      // meta.pt is small and read whole: every record's zip CRC-32 is checked.
      const auto meta = open_torch_file(where, "meta.pt");
      engine::check_records_but(meta->archive(), "", 0, where.child("meta.pt").to_string());
      read_loop_settings(*meta->root());
    } catch (...) {
      error = std::current_exception();
    }
  } else {
    try {
      const auto [dir, name] = parent_and_name(where);
      auto tf = open_torch_file(dir, name);
      // The zip CRC-32 of every record read: small ones now, tensors' as they are read.
      engine::TorchFileCrc crc(*tf, path);
      crc.check_small_records();
      const Value& root = *tf->root();
      ValuePtr sd = root.get("state_dict");
      if (!sd) throw FormatError(fmt::format("{}: no \"state_dict\"", path));
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        ValuePtr node = sd->get(names[i]);
        if (!node) throw PlanError(fmt::format("{}: missing key \"{}\" in state_dict", path, names[i]));
        read_piece(*tf, *node, names[i], shapes[i], strategy_.local_params()[i], rank, world, crc);
      }
      ValuePtr opts = root.get("optimizer_states");
      ValuePtr ostate = opts && !opts->items().empty() ? opts->items()[0]->get("state") : nullptr;
      for (const auto& [k, per] : ostate ? ostate->entries() : pickle::DictEntries{}) {
        // Lightning's full files key the state by parameter id (its position in the model),
        // consolidated ones by FQN: accept both.
        std::string name;
        if (k->is(pickle::Kind::kInt)) {
          const std::int64_t id = k->as_int();
          if (id < 0 || id >= static_cast<std::int64_t>(names.size())) {
            throw PlanError(fmt::format("{}: optimizer state of parameter id {}, the model has {} parameters", path, id,
                                        names.size()));
          }
          name = names[static_cast<std::size_t>(id)];
        } else {
          name = k->as_string();
        }
        const auto at = std::find(names.begin(), names.end(), name);
        if (at == names.end()) continue;  // not a parameter of this model (ignored, as DCP does)
        const std::size_t i = static_cast<std::size_t>(at - names.begin());
        for (auto& [key, t] : optimizer_->state()[name]) {
          ValuePtr node = per->get(key);
          if (!node) throw PlanError(fmt::format("{}: optimizer state of \"{}\" has no \"{}\"", path, name, key));
          if (t.dim() == 0) {
            const torchfile::TensorInfo* info = tf->tensor_of(*node);
            if (!info) throw FormatError(fmt::format("{}: {}.{} is not a tensor", path, name, key));
            read_checked(*tf, *info, name + "." + key, std::span<std::byte>(static_cast<std::byte*>(t.data_ptr()), 4),
                         crc);
          } else {
            read_piece(*tf, *node, name + "." + key, shapes[i], t, rank, world, crc);
          }
        }
      }
      read_loop_settings(root);
    } catch (...) {
      error = std::current_exception();
    }
  }
  comm.rethrow_if_any_failed(error);
  const double seconds = seconds_since(t0);
  if (options_.progress && rank == 0) {
    std::printf("loaded %s checkpoint %s (global_step %lld) in %.3f s\n", found.c_str(), path.c_str(),
                static_cast<long long>(step), seconds);
    std::fflush(stdout);
  }
  return step;
}

FitResult Trainer::fit(comm::Communicator& comm, const ModelConfig& model, const TextCorpus& data,
                       const std::string& ckpt_path) {
  comm_ = &comm;
  data_ = &data;
  const int rank = comm.rank();
  FitResult result;
  // 1. parameters and the checkpoint callback (its options are checked on every rank)
  strategy_.setup(comm, param_specs(model), init_params(model, options_.seed));
  optimizer_ = std::make_unique<ShardedOptimizer>(options_.optimizer, strategy_.names());
  optimizer_->ensure_state(strategy_.local_params());
  checkpoint_ = std::make_unique<ModelCheckpoint>(options_.checkpoint);
  if (options_.accumulate_grad_batches < 1) throw UsageError("accumulate_grad_batches must be >= 1");

  // 2. the checkpoints folder (rank 0 decides; created by the first save)
  std::string dirpath;  // broadcast as text
  on_rank0(comm, [&] { dirpath = next_checkpoints_dir(options_.default_root_dir).to_string(); });
  const Location checkpoints_dir = Location::parse(comm.broadcast(dirpath));

  // 3. resume
  std::int64_t start = 0;
  std::optional<Location> resumed_from;
  if (!ckpt_path.empty()) {
    std::string resolved;  // broadcast as text; "" for none
    on_rank0(comm, [&] {
      if (ckpt_path != "last") {
        resolved = normalize_checkpoint_path(Location::parse(ckpt_path)).to_string();
        return;
      }
      const LastCheckpoint last = resolve_last_checkpoint(options_.default_root_dir);
      if (last.path) resolved = last.path->to_string();
      if (!last.note.empty()) std::fprintf(stderr, "note: --ckpt-path last: %s\n", last.note.c_str());
    });
    resolved = comm.broadcast(resolved);
    if (resolved.empty()) {
      if (rank == 0) {
        std::fprintf(stderr,
                     "warning: .fit(ckpt_path=\"last\") is set, but there is no last checkpoint available under %s. "
                     "No checkpoint will be loaded. HINT: save one with --save-last.\n",
                     options_.default_root_dir.to_string().c_str());
      }
    } else {
      const auto t0 = Clock::now();
      resumed_from = Location::parse(resolved);
      start = load_checkpoint(*resumed_from);
      result.load_seconds = seconds_since(t0);
      result.resumed_from = resolved;
    }
  }
  result.start_step = start;
  schedule_ = DataSchedule{data.size(), options_.global_batch, options_.accumulate_grad_batches};
  checkpoint_->set_paths(checkpoints_dir, resumed_from);

  // 4. train, with the checkpoint hooks after every step
  std::int64_t max_epochs = options_.max_epochs;
  if (options_.max_steps < 0 && max_epochs < 0) max_epochs = 1000;
  const std::int64_t steps_per_epoch = schedule_.steps_per_epoch();
  auto done = [&](std::int64_t step) {
    return (options_.max_steps >= 0 && step >= options_.max_steps) ||
           (max_epochs >= 0 && schedule_.epoch_of_step(step) >= max_epochs);
  };
  std::int64_t last_step = max_epochs >= 0 ? max_epochs * steps_per_epoch : options_.max_steps;
  if (options_.max_steps >= 0) last_step = std::min(last_step, options_.max_steps);
  CheckpointActions io;
  io.exists = [&](const Location& path) {
    // A path whose removal waits for the save in flight, or the save's own path (a local
    // one appears only when committed): answer as after that commit.
    if (path == pending_path_ ||
        std::find(pending_removals_.begin(), pending_removals_.end(), path) != pending_removals_.end()) {
      finish_pending(result);
    }
    std::string answer;
    on_rank0(comm, [&] { answer = path_exists(path) ? "1" : "0"; });
    return comm.broadcast(answer) == "1";
  };
  io.save = [&](const Location& path) { save_checkpoint(path, result); };
  io.remove = [&](const Location& path) {
    if (pending_) pending_removals_.push_back(path);  // only once the new one is committed
    else remove_checkpoint(path);
  };
  try {
    for (std::int64_t step = start; !done(step);) {
      const std::int64_t epoch = schedule_.epoch_of_step(step);
      const auto t0 = Clock::now();
      const StepResult r =
          run_step(strategy_, *optimizer_, model, data, schedule_, step, options_.seed, options_.gradient_clip_val);
      const double dt = seconds_since(t0);
      ++step;
      result.losses.push_back(r.loss);
      if (options_.progress && rank == 0) {
        std::printf("step %lld/%lld  epoch %lld  loss %.4f  %.0f tokens/s\n", static_cast<long long>(step),
                    static_cast<long long>(last_step), static_cast<long long>(epoch), r.loss,
                    static_cast<double>(schedule_.batches_in_step(step - 1) * options_.global_batch * kBlockSize) / dt);
        std::fflush(stdout);
      }
      position_ = TrainPosition{epoch, step, r.loss};
      in_epoch_end_ = false;
      checkpoint_->on_train_batch_end(position_, io);
      if (step % steps_per_epoch == 0 || done(step)) {
        in_epoch_end_ = true;
        checkpoint_->on_train_epoch_end(position_, io);
      }
    }
    finish_pending(result);
  } catch (...) {
    // Commit what was staged before the failure (every rank gets here: the trainer's errors
    // are thrown on every rank); a failing commit only adds a warning to the first error.
    try {
      finish_pending(result);
    } catch (const std::exception& e) {
      if (rank == 0) std::fprintf(stderr, "warning: the checkpoint in flight was not committed: %s\n", e.what());
    }
    throw;
  }
  for (const Location& saved : checkpoint_->saved()) result.saved.push_back(saved.to_string());
  result.checkpoint_path = result.saved.empty() ? "" : result.saved.back();
  result.best_model_path = checkpoint_->best_model_path();
  return result;
}

void Trainer::save_checkpoint(const Location& where, FitResult& result) {
  const std::string& path = where.to_string();  // in messages
  comm::Communicator& comm = *comm_;
  const int rank = comm.rank(), world = comm.world_size();
  const auto t0 = Clock::now();
  const auto shapes = strategy_.global_shapes();
  const std::vector<std::string> names = strategy_.names();
  const std::int64_t step = position_.global_step;
  const std::int64_t in_epoch = step - schedule_.epoch_of_step(step - 1) * schedule_.steps_per_epoch();
  LoopState loops;
  loops.epoch = position_.epoch;
  loops.global_step = step;
  loops.batches_total = schedule_.batches_before(step);
  loops.batches_in_epoch = loops.batches_total - position_.epoch * schedule_.batches_per_epoch();
  loops.steps_in_epoch = in_epoch;
  loops.is_last_batch = in_epoch == schedule_.steps_per_epoch();
  loops.epoch_processed = in_epoch_end_;
  const auto [parent, name] = parent_and_name(where);
  finish_pending(result);  // a new save starts after the previous one is committed
  const bool local = !where.is_remote();
  if (local) on_rank0(comm, [&] { remove_leftovers(parent); });
  if (strategy_.state_dict_type() == StateDictType::kSharded) {
    // Local: written in a hidden sibling, swapped in once committed (publish()), so the
    // checkpoint at the path stays whole until its successor is. Object stores cannot swap
    // (docs/durability.md): a file at the path goes and an older checkpoint there loses its
    // commit marker first, so a save that dies half way never looks committed; resuming
    // from "last" then takes the newest committed checkpoint of the run.
    const Location folder = local ? staging_path_for(where, step) : where;
    if (!local) {
      on_rank0(comm, [&] {
        auto dir = storage::open_storage(parent);
        if (dir->try_stat(name)) dir->remove(name);
        storage::open_storage(where)->remove("meta.pt");
      });
    }
    engine::StateDict root;
    root.emplace_back("model", strategy_.model_state());
    root.emplace_back("optimizer_0", optimizer_->state_dict(shapes, rank, world));
    auto st = storage::open_storage(folder);
    if (options_.async_save) {
      // Stall: plan + copy into staging; meta.pt is built now (this save's loop counters and
      // callback state) and written by finish_pending() after the commit.
      std::string meta;  // built first: a pending save always has its meta.pt
      on_rank0(comm, [&] { meta = meta_pt_bytes(options_, *checkpoint_, loops, schedule_); });
      if (!staging_) staging_ = std::make_unique<engine::StagingPool>();
      engine::AsyncSaveOptions async_options;
      async_options.staging = staging_.get();
      pending_ = engine::async_save(engine::StateNode(std::move(root)), *st, comm, async_options);
      pending_storage_ = std::move(st);
      pending_path_ = where;
      pending_folder_ = folder;
      pending_meta_ = std::move(meta);
      result.save_seconds = pending_->report().stall_seconds;
      if (options_.progress && rank == 0) {
        std::printf(
            "saved sharded checkpoint %s in %.3f s (training stall; %.1f MB staged, writing in the background)\n",
            path.c_str(), result.save_seconds, static_cast<double>(pending_->report().staged_bytes) / 1e6);
        std::fflush(stdout);
      }
      return;
    } else {
      try {
        engine::SaveReport report = engine::save(engine::StateNode(std::move(root)), *st, comm);
        result.checkpoint_bytes = report.bytes_written;
        on_rank0(comm, [&] {
          const std::string bytes = meta_pt_bytes(options_, *checkpoint_, loops, schedule_);
          kill_point(KillPoint::kMetaPt);
          st->write_atomic("meta.pt", as_bytes(bytes));
          result.checkpoint_bytes += bytes.size();
          publish(folder, where);
        });
      } catch (...) {
        discard_staging(folder, where);  // every rank has stopped writing: save() failed on all
        throw;
      }
    }
  } else {
    std::vector<at::Tensor> full = strategy_.full_params();
    // Full optimizer state: gather each state tensor (pieces laid out like the params).
    std::map<std::string, std::map<std::string, at::Tensor>> full_state;
    std::vector<std::string> keys;
    if (!optimizer_->state().empty()) {
      for (const auto& [k, t] : optimizer_->state().begin()->second) keys.push_back(k);
    }
    for (const std::string& key : keys) {
      std::vector<at::Tensor> pieces;
      for (const auto& n : names) pieces.push_back(optimizer_->state()[n][key]);
      std::vector<at::Tensor> gathered =
          pieces.front().dim() == 0 ? pieces : strategy_.all_gather(pieces);  // "step" is replicated
      for (std::size_t i = 0; i < gathered.size(); ++i) full_state[names[i]][key] = gathered[i];
    }
    on_rank0(comm, [&] {
      if (!where.is_remote() && fs::is_directory(path)) {
        if (!fs::is_regular_file(fs::path(path) / "meta.pt")) {
          throw UsageError(fmt::format("The checkpoint path exists and is a directory: {}", path));
        }
        fs::remove_all(path);
      } else if (where.is_remote() && storage::open_storage(where)->try_stat("meta.pt")) {
        storage::open_storage(parent)->remove_prefix(name + "/");
      }
      TorchFileBuilder files;
      pickle::DictEntries meta = meta_entries(options_, *checkpoint_, loops, schedule_, files);
      const engine::StateNode groups = optimizer_->state_dict(shapes, 0, 1);
      const std::string bytes = full_checkpoint_bytes(std::move(meta), names, full, full_state,
                                                      groups.find("param_groups")->list().front(), files);
      storage::open_storage(parent)->write_atomic(name, as_bytes(bytes));
      result.checkpoint_bytes = bytes.size();
    });
  }
  result.save_seconds = seconds_since(t0);
  if (options_.progress && rank == 0) {
    const std::string type(state_dict_type_name(strategy_.state_dict_type()));
    std::printf("saved %s checkpoint %s in %.3f s\n", type.c_str(), path.c_str(), result.save_seconds);
    std::fflush(stdout);
  }
}

void Trainer::finish_pending(FitResult& result) {
  if (!pending_) return;
  comm::Communicator& comm = *comm_;
  // Taken out first: whatever happens below, nothing stays in flight. The storage outlives
  // the PendingSave (locals are destroyed in reverse order).
  const std::unique_ptr<storage::Storage> st = std::move(pending_storage_);
  const std::unique_ptr<engine::PendingSave> pending = std::move(pending_);
  const Location path = *std::exchange(pending_path_, std::nullopt);
  const Location folder = std::exchange(pending_folder_, {});
  const std::string meta = std::exchange(pending_meta_, {});
  const std::vector<Location> removals = std::exchange(pending_removals_, {});
  const auto t0 = Clock::now();
  std::uint64_t bytes = 0;
  try {
    bytes = pending->wait().bytes_written;
    on_rank0(comm, [&] {
      kill_point(KillPoint::kMetaPt);
      st->write_atomic("meta.pt", as_bytes(meta));
      bytes += meta.size();
      publish(folder, path);
    });
  } catch (...) {
    discard_staging(folder, path);  // wait() fails on every rank once all have stopped writing
    throw;
  }
  result.checkpoint_bytes = bytes;
  if (options_.progress && comm.rank() == 0) {
    std::printf("committed sharded checkpoint %s (waited %.3f s)\n", path.to_string().c_str(), seconds_since(t0));
    std::fflush(stdout);
  }
  for (const Location& old : removals) remove_checkpoint(old);
}

void Trainer::publish(const Location& folder, const Location& path) {
  if (folder == path) return;  // written in place (object stores)
  storage::replace_local_folder(folder.to_string(), path.to_string(), /*durable=*/true);
}

void Trainer::discard_staging(const Location& folder, const Location& path) {
  if (folder == path || comm_->rank() != 0) return;  // written in place (object stores): nothing staged
  // Best effort: the save's own error is the one to report. What cannot be removed now (the
  // checkpoints folder lost its write permission) the next save's remove_leftovers() takes.
  std::error_code ignored;
  fs::remove_all(folder.to_string(), ignored);
}

void Trainer::remove_leftovers(const Location& dir) {
  // The first save of a fit also cleans the other version folders: a resumed run writes
  // into a new one, and what the killed run left lies in its own.
  std::vector<Location> dirs{dir};
  if (!cleaned_other_versions_) {
    dirs = local_checkpoints_dirs(options_.default_root_dir);
    // Compared as absolute paths: a relative root lists relative folders, and `dir` may be
    // the same folder spelled from the working directory.
    const Location here = dir.absolute();
    if (std::none_of(dirs.begin(), dirs.end(), [&](const Location& d) { return d.absolute() == here; })) {
      dirs.push_back(dir);
    }
    cleaned_other_versions_ = true;
  }
  std::size_t removed = 0;
  for (const Location& d : dirs) removed += engine::remove_stale_staging(d);
  if (removed > 0 && options_.progress) {
    std::printf("removed %zu leftover(s) of unfinished saves\n", removed);
    std::fflush(stdout);
  }
}

void Trainer::remove_checkpoint(const Location& path) {
  if (comm_->rank() != 0) return;
  try {
    engine::remove_checkpoint(path);  // uncommitted first: a crash midway leaves no checkpoint
    if (options_.progress) std::printf("removed checkpoint %s\n", path.to_string().c_str());
  } catch (const std::exception& e) {  // a leftover old checkpoint is no reason to stop training
    std::fprintf(stderr, "warning: could not remove checkpoint %s: %s\n", path.to_string().c_str(), e.what());
  }
  std::fflush(stdout);
}

}  // namespace shardpoint::train
