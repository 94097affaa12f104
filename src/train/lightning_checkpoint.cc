#include "train/lightning_checkpoint.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "core/byte_stream.h"
#include "torch/tensor_adapter.h"
#include "torchfile/torch_file.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::train {
namespace {

using pickle::Value;
using pickle::ValuePtr;

ValuePtr s(const char* text) { return Value::str(text); }

// Lightning's progress trackers, field for field as Lightning 2.6 pickles them: a dict
// {"total": {...}, "current": {...}} of counters in the order ready, completed, started,
// processed; optimizer steps and scheduler steps count only ready and completed, zero_grad
// adds started, batches and epochs have all four.
enum class Tracker { kReadyCompleted, kStarted, kProcessed };
struct Counters {
  std::int64_t ready = 0, completed = 0, started = 0, processed = 0;
  static Counters all(std::int64_t n) { return {n, n, n, n}; }
};
ValuePtr counters_value(Tracker kind, const Counters& c) {
  pickle::DictEntries e{{s("ready"), Value::integer(c.ready)}, {s("completed"), Value::integer(c.completed)}};
  if (kind != Tracker::kReadyCompleted) e.emplace_back(s("started"), Value::integer(c.started));
  if (kind == Tracker::kProcessed) e.emplace_back(s("processed"), Value::integer(c.processed));
  return Value::dict(std::move(e));
}
ValuePtr progress(Tracker kind, const Counters& total, const Counters& current,
                  std::optional<bool> is_last_batch = std::nullopt) {
  pickle::DictEntries e{{s("total"), counters_value(kind, total)}, {s("current"), counters_value(kind, current)}};
  if (is_last_batch) e.emplace_back(s("is_last_batch"), Value::boolean(*is_last_batch));
  return Value::dict(std::move(e));
}
// An evaluation loop that never ran ({"state_dict": {}, "batch_progress": zeros}).
ValuePtr idle_loop(bool with_last_batch_flag) {
  return Value::dict(
      {{s("state_dict"), Value::dict()},
       {s("batch_progress"),
        progress(Tracker::kProcessed, {}, {}, with_last_batch_flag ? std::optional<bool>(false) : std::nullopt)}});
}

// The loops as Lightning records them at the moment ModelCheckpoint saves. A save from
// on_train_batch_end runs before Lightning marks that batch completed and before it counts
// it in _batches_that_stepped, so both lag the step by one there; a save from
// on_train_epoch_end sees every batch completed.
ValuePtr loops_value(const LoopState& l) {
  const Counters steps_total = Counters::all(l.global_step), steps_current = Counters::all(l.steps_in_epoch);
  const std::int64_t lag = l.epoch_processed ? 0 : 1;
  Counters batches_total = Counters::all(l.batches_total), batches_current = Counters::all(l.batches_in_epoch);
  batches_total.completed -= std::min<std::int64_t>(lag, batches_total.completed);
  batches_current.completed -= std::min<std::int64_t>(lag, batches_current.completed);
  const std::int64_t stepped = l.global_step - std::min<std::int64_t>(lag, l.global_step);
  const Counters epochs{l.epoch + 1, l.epoch, l.epoch + 1, l.epoch + (l.epoch_processed ? 1 : 0)};
  ValuePtr fit = Value::dict({
      {s("state_dict"), Value::dict()},
      {s("epoch_loop.state_dict"), Value::dict({{s("_batches_that_stepped"), Value::integer(stepped)}})},
      {s("epoch_loop.batch_progress"), progress(Tracker::kProcessed, batches_total, batches_current, l.is_last_batch)},
      {s("epoch_loop.scheduler_progress"), progress(Tracker::kReadyCompleted, {}, {})},
      {s("epoch_loop.automatic_optimization.state_dict"), Value::dict()},
      {s("epoch_loop.automatic_optimization.optim_progress"),
       Value::dict({{s("optimizer"),
                     Value::dict({{s("step"), progress(Tracker::kReadyCompleted, steps_total, steps_current)},
                                  {s("zero_grad"), progress(Tracker::kStarted, steps_total, steps_current)}})}})},
      {s("epoch_loop.manual_optimization.state_dict"), Value::dict()},
      {s("epoch_loop.manual_optimization.optim_step_progress"), progress(Tracker::kReadyCompleted, {}, {})},
      {s("epoch_loop.val_loop.state_dict"), Value::dict()},
      {s("epoch_loop.val_loop.batch_progress"), progress(Tracker::kProcessed, {}, {}, false)},
      {s("epoch_progress"), progress(Tracker::kProcessed, epochs, epochs)},
  });
  return Value::dict({{s("fit_loop"), fit},
                      {s("validate_loop"), idle_loop(true)},
                      {s("test_loop"), idle_loop(true)},
                      {s("predict_loop"), idle_loop(false)}});
}

}  // namespace

ValuePtr TorchFileBuilder::tensor(const at::Tensor& t) {
  tensors_.push_back(t.contiguous());
  const engine::TensorShard shard = torchx::whole_of(tensors_.back());
  const std::uint64_t numel = static_cast<std::uint64_t>(tensors_.back().numel());
  return torchfile::make_tensor_node(shard.dtype, shard.global_shape, torchfile::contiguous_strides(shard.global_shape),
                                     0, std::to_string(tensors_.size() - 1), numel);
}

ValuePtr TorchFileBuilder::scalar(float v) { return tensor(at::full({}, v, at::kFloat)); }

std::string TorchFileBuilder::bytes(const Value& root) {
  StringSink sink;
  torchfile::TorchSaveWriter writer(sink);
  writer.write_pickle(root);
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const engine::TensorShard shard = torchx::whole_of(tensors_[i]);
    writer.write_storage(std::to_string(i), shard.data);
  }
  writer.finish();
  return sink.take();
}

pickle::DictEntries meta_entries(const TrainerOptions& o, const ModelCheckpoint& mc, const LoopState& loops,
                                 const DataSchedule& schedule, TorchFileBuilder& files) {
  auto score = [&](const std::optional<float>& v) { return v ? files.scalar(*v) : Value::none(); };
  pickle::DictEntries best_k;
  for (const auto& [path, value] : mc.best_k_models())
    best_k.emplace_back(Value::str(path.to_string()), files.scalar(value));
  ValuePtr state = Value::dict({
      {s("monitor"), mc.monitor().empty() ? Value::none() : Value::str(mc.monitor())},
      {s("best_model_score"), score(mc.best_model_score())},
      {s("best_model_path"), Value::str(mc.best_model_path())},
      {s("current_score"), score(mc.current_score())},
      {s("dirpath"), Value::str(mc.dirpath().to_string())},
      {s("best_k_models"), Value::dict(std::move(best_k))},
      {s("kth_best_model_path"), Value::str(mc.kth_best_model_path())},
      {s("kth_value"), files.scalar(mc.kth_value())},
      {s("last_model_path"), Value::str(mc.last_model_path())},
  });
  ValuePtr shardpoint = Value::dict({
      {s("seed"), Value::integer(static_cast<std::int64_t>(o.seed))},
      {s("global_batch"), Value::integer(o.global_batch)},
      {s("accumulate_grad_batches"), Value::integer(schedule.accumulate)},
      {s("model_size"), Value::str(o.model_size)},
      {s("optimizer"), Value::str(o.optimizer.name)},
      {s("next_item"), Value::integer(schedule.item(schedule.batches_before(loops.global_step), 0))},
      {s("rng"), s("dropout generator seeded per item: splitmix64(seed ^ splitmix64(item position))")},
  });
  return {{s("epoch"), Value::integer(loops.epoch)},
          {s("global_step"), Value::integer(loops.global_step)},
          {s("pytorch-lightning_version"), s(kLightningVersion)},
          {s("loops"), loops_value(loops)},
          {s("callbacks"), Value::dict({{Value::str(mc.state_key()), state}})},
          {s("lr_schedulers"), Value::list()},
          {s("shardpoint"), shardpoint}};
}

std::string meta_pt_bytes(const TrainerOptions& o, const ModelCheckpoint& mc, const LoopState& loops,
                          const DataSchedule& schedule) {
  TorchFileBuilder files;
  return files.bytes(*Value::dict(meta_entries(o, mc, loops, schedule, files)));
}

std::string full_checkpoint_bytes(pickle::DictEntries meta, const std::vector<std::string>& names,
                                  const std::vector<at::Tensor>& params,
                                  const std::map<std::string, std::map<std::string, at::Tensor>>& optimizer_state,
                                  const engine::StateNode& param_group, TorchFileBuilder& files) {
  pickle::DictEntries sd;
  for (std::size_t i = 0; i < params.size(); ++i) sd.emplace_back(Value::str(names[i]), files.tensor(params[i]));
  pickle::DictEntries state;
  for (std::size_t id = 0; id < names.size(); ++id) {
    auto it = optimizer_state.find(names[id]);
    if (it == optimizer_state.end()) continue;
    pickle::DictEntries per;
    for (const auto& [key, t] : it->second) per.emplace_back(Value::str(key), files.tensor(t));
    state.emplace_back(Value::integer(static_cast<std::int64_t>(id)), Value::dict(std::move(per)));
  }
  ValuePtr group = Value::dict();
  for (const auto& [k, v] : param_group.dict()) {
    if (k != "params") group->mutable_entries().emplace_back(Value::str(k), v.object());
  }
  std::vector<ValuePtr> ids;
  for (std::size_t id = 0; id < names.size(); ++id) ids.push_back(Value::integer(static_cast<std::int64_t>(id)));
  group->mutable_entries().emplace_back(s("params"), Value::list(std::move(ids)));
  ValuePtr optimizer =
      Value::dict({{s("state"), Value::dict(std::move(state))}, {s("param_groups"), Value::list({group})}});
  pickle::DictEntries root(meta.begin(), meta.begin() + 3);
  root.emplace_back(s("state_dict"), Value::dict(std::move(sd)));
  for (std::size_t i = 3; i < meta.size(); ++i) {
    if (meta[i].first->as_string() == "lr_schedulers")
      root.emplace_back(s("optimizer_states"), Value::list({optimizer}));
    root.push_back(std::move(meta[i]));
  }
  return files.bytes(*Value::dict(std::move(root)));
}

}  // namespace shardpoint::train
