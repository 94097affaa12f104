#include "train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "core/byte_stream.h"
#include "core/error.h"
#include "engine/checkpoint.h"
#include "engine/torch_save.h"
#include "pickle/value.h"
#include "storage/storage.h"
#include "storage/storage_registry.h"
#include "torch/tensor_adapter.h"
#include "torchfile/torch_file.h"

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

engine::StateNode obj(ValuePtr v) { return engine::StateNode(std::move(v)); }
engine::StateNode integer(std::int64_t v) { return obj(Value::integer(v)); }

// A Lightning progress tracker {"total": {...}, "current": {...}} with all counters n.
ValuePtr progress(std::int64_t total, std::int64_t current, bool batch) {
  auto counters = [](std::int64_t n) {
    return Value::dict({{Value::str("ready"), Value::integer(n)},
                        {Value::str("started"), Value::integer(n)},
                        {Value::str("processed"), Value::integer(n)},
                        {Value::str("completed"), Value::integer(n)}});
  };
  pickle::DictEntries e{{Value::str("total"), counters(total)}, {Value::str("current"), counters(current)}};
  if (batch) e.emplace_back(Value::str("is_last_batch"), Value::boolean(false));
  return Value::dict(std::move(e));
}

ValuePtr loops_value(std::int64_t epoch, std::int64_t step) {
  auto s = [](const char* k) { return Value::str(k); };
  ValuePtr fit = Value::dict({
      {s("state_dict"), Value::dict()},
      {s("epoch_loop.state_dict"), Value::dict({{s("_batches_that_stepped"), Value::integer(step)}})},
      {s("epoch_loop.batch_progress"), progress(step, step, true)},
      {s("epoch_loop.scheduler_progress"), progress(0, 0, false)},
      {s("epoch_loop.automatic_optimization.optim_progress"),
       Value::dict({{s("optimizer"), Value::dict({{s("step"), progress(step, step, false)},
                                                  {s("zero_grad"), progress(step, step, false)}})}})},
      {s("epoch_loop.manual_optimization.optim_step_progress"), progress(0, 0, false)},
      {s("epoch_progress"), progress(epoch, epoch, false)},
  });
  return Value::dict({{s("fit_loop"), fit},
                      {s("validate_loop"), Value::dict()},
                      {s("test_loop"), Value::dict()},
                      {s("predict_loop"), Value::dict()}});
}

constexpr const char* kCheckpointCallbackKey =
    "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, "
    "'train_time_interval': None}";

// Everything but the tensors of model and optimizer: Lightning's meta.pt keys in its order,
// then shardpoint's own resume data. kth_value must outlive the returned tree.
engine::StateDict meta_entries(const TrainerOptions& o, std::int64_t epoch, std::int64_t step,
                               const std::string& path, const std::string& dirpath, const at::Tensor& kth_value,
                               std::int64_t dataset_size) {
  engine::StateDict m;
  m.emplace_back("epoch", integer(epoch));
  m.emplace_back("global_step", integer(step));
  m.emplace_back("pytorch-lightning_version", obj(Value::str(kLightningVersion)));
  m.emplace_back("loops", obj(loops_value(epoch, step)));
  engine::StateDict ckpt;
  ckpt.emplace_back("monitor", obj(Value::none()));
  ckpt.emplace_back("best_model_score", obj(Value::none()));
  ckpt.emplace_back("best_model_path", obj(Value::str(path)));
  ckpt.emplace_back("current_score", obj(Value::none()));
  ckpt.emplace_back("dirpath", obj(Value::str(dirpath)));
  ckpt.emplace_back("best_k_models", engine::StateNode(engine::StateDict{}));
  ckpt.emplace_back("kth_best_model_path", obj(Value::str("")));
  ckpt.emplace_back("kth_value", engine::StateNode(torchx::whole_of(kth_value)));
  ckpt.emplace_back("last_model_path", obj(Value::str("")));
  engine::StateDict callbacks;
  callbacks.emplace_back(kCheckpointCallbackKey, engine::StateNode(std::move(ckpt)));
  m.emplace_back("callbacks", engine::StateNode(std::move(callbacks)));
  m.emplace_back("lr_schedulers", engine::StateNode(engine::StateList{}));
  engine::StateDict sp;
  sp.emplace_back("seed", integer(static_cast<std::int64_t>(o.seed)));
  sp.emplace_back("global_batch", integer(o.global_batch));
  sp.emplace_back("model_size", obj(Value::str(o.model_size)));
  sp.emplace_back("optimizer", obj(Value::str(o.optimizer.name)));
  sp.emplace_back("next_item", integer(step * o.global_batch % dataset_size));
  sp.emplace_back("rng", obj(Value::str("dropout generator seeded per item: splitmix64(seed ^ splitmix64(item position))")));
  m.emplace_back("shardpoint", engine::StateNode(std::move(sp)));
  return m;
}

// Writes root as a torch.save file: tmp + rename, so a reader never sees half a file.
std::uint64_t write_torch_file(const engine::StateNode& root, const std::string& path) {
  StringSink sink;
  engine::write_torch_save(root, sink);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(sink.str().data(), static_cast<std::streamsize>(sink.str().size()));
    out.flush();
    if (!out) throw StorageError(StorageError::Kind::kOther, fmt::format("{}: write failed", tmp));
  }
  fs::rename(tmp, path);
  return sink.str().size();
}

std::int64_t meta_int(const Value& root, const char* key) {
  ValuePtr v = root.get(key);
  if (!v) throw FormatError(fmt::format("checkpoint has no \"{}\"", key));
  return v->as_int();
}

// Copies this rank's dim-0 piece of a full tensor stored in tf into dst.
void read_piece(const torchfile::TorchFile& tf, const Value& node, const std::string& what, const engine::Shape& shape,
                at::Tensor& dst, int rank, int world) {
  const torchfile::TensorInfo* info = tf.tensor_of(node);
  if (!info) throw FormatError(fmt::format("{}: not a tensor", what));
  if (engine::Shape(info->shape.begin(), info->shape.end()) != shape || info->dtype != DType::kFloat32) {
    throw PlanError(fmt::format("{}: checkpoint has {} {}, the model needs float32 {}", what,
                                dtype_name(info->dtype), engine::shape_to_string(engine::Shape(info->shape.begin(), info->shape.end())),
                                engine::shape_to_string(shape)));
  }
  at::Tensor full = at::empty(std::vector<std::int64_t>(shape.begin(), shape.end()), at::kFloat);
  tf.read_tensor(*info, std::span<std::byte>(static_cast<std::byte*>(full.data_ptr()), info->nbytes()));
  dst.copy_(torchx::dim0_slice(full, rank, world));
}

}  // namespace

double run_step(FSDPStrategy& strategy, ShardedOptimizer& optimizer, const ModelConfig& model, const TextCorpus& data,
                std::int64_t step, std::int64_t global_batch, std::uint64_t seed) {
  comm::Communicator& comm = strategy.comm();
  const int rank = comm.rank(), world = comm.world_size();
  std::vector<at::Tensor> full = strategy.all_gather_params();
  at::Tensor total;
  std::vector<std::int64_t> in, tg;
  for (std::int64_t j = rank; j < global_batch; j += world) {
    const std::int64_t position = step * global_batch + j;  // unique per item of the run
    data.item(position % data.size(), in, tg);
    at::Tensor inputs = at::tensor(in, at::kLong).view({1, kBlockSize});
    at::Tensor targets = at::tensor(tg, at::kLong).view({1, kBlockSize});
    at::Generator gen = at::detail::createCPUGenerator(mix(seed ^ mix(static_cast<std::uint64_t>(position))));
    at::Tensor loss = loss_sum(model, full, inputs, targets, true, gen);
    total = total.defined() ? total + loss : loss;
  }
  double local = 0;
  if (total.defined()) {
    local = total.item<double>();
    total.backward();
  }
  const double tokens = static_cast<double>(global_batch * kBlockSize);
  std::vector<at::Tensor> grads = strategy.reduce_scatter_grads(full, 1.0 / tokens);
  optimizer.step(strategy.local_params(), grads);
  return comm.all_reduce(local, comm::ReduceOp::kSum) / tokens;
}

Trainer::Trainer(TrainerOptions options, FSDPStrategy strategy)
    : options_(std::move(options)), strategy_(std::move(strategy)) {}

FitResult Trainer::fit(comm::Communicator& comm, const ModelConfig& model, const TextCorpus& data,
                       const std::string& ckpt_path) {
  const int rank = comm.rank(), world = comm.world_size();
  FitResult result;
  // 1. parameters
  strategy_.setup(comm, param_specs(model), init_params(model, options_.seed));
  optimizer_ = std::make_unique<ShardedOptimizer>(options_.optimizer, strategy_.names());
  optimizer_->ensure_state(strategy_.local_params());

  // 2. the checkpoints folder (rank 0 decides)
  std::string dirpath;
  if (rank == 0) {
    const fs::path logs = fs::path(options_.default_root_dir) / "lightning_logs";
    int version = 0;
    if (fs::is_directory(logs)) {
      for (const auto& e : fs::directory_iterator(logs)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.rfind("version_", 0) == 0 && n.size() > 8 &&
            n.find_first_not_of("0123456789", 8) == std::string::npos) {
          version = std::max(version, std::stoi(n.substr(8)) + 1);
        }
      }
    }
    const fs::path dir = logs / fmt::format("version_{}", version) / "checkpoints";
    fs::create_directories(dir);
    dirpath = fs::absolute(dir).lexically_normal().string();
  }
  dirpath = comm.broadcast(dirpath);

  // 3. resume
  std::int64_t start = 0;
  if (!ckpt_path.empty()) {
    std::string kind;  // "sharded", "full" or "" (invalid), decided on rank 0
    if (rank == 0) {
      const fs::path p(ckpt_path);
      if (fs::is_directory(p) && fs::is_regular_file(p / "meta.pt")) kind = "sharded";
      else if (fs::is_regular_file(p)) kind = "full";
    }
    kind = comm.broadcast(kind);
    if (kind.empty()) {
      throw UsageError(fmt::format(
          "The path '{}' does not point to a valid checkpoint. Make sure the path points to either a directory with "
          "FSDP checkpoint shards, or a single file with a full checkpoint.",
          ckpt_path));
    }
    const auto t0 = Clock::now();
    const auto shapes = strategy_.global_shapes();
    if (kind == "sharded") {
      engine::StateDict root;
      root.emplace_back("model", strategy_.model_state());
      root.emplace_back("optimizer_0", optimizer_->state_dict(shapes, rank, world));
      engine::StateNode state(std::move(root));
      auto st = storage::open_storage(ckpt_path);
      engine::load(state, *st, comm);
      auto meta = torchfile::TorchFile::open((fs::path(ckpt_path) / "meta.pt").string());
      start = meta_int(*meta->root(), "global_step");
      if (auto sp = meta->root()->get("shardpoint")) options_.global_batch = meta_int(*sp, "global_batch");
    } else {
      std::exception_ptr error;
      try {
        auto tf = torchfile::TorchFile::open(ckpt_path);
        const Value& root = *tf->root();
        ValuePtr sd = root.get("state_dict");
        if (!sd) throw FormatError(fmt::format("{}: no \"state_dict\"", ckpt_path));
        for (std::size_t i = 0; i < shapes.size(); ++i) {
          const std::string& name = strategy_.specs()[i].name;
          ValuePtr node = sd->get(name);
          if (!node) throw PlanError(fmt::format("{}: missing key \"{}\" in state_dict", ckpt_path, name));
          read_piece(*tf, *node, name, shapes[i], strategy_.local_params()[i], rank, world);
        }
        ValuePtr opts = root.get("optimizer_states");
        ValuePtr ostate = opts && !opts->items().empty() ? opts->items()[0]->get("state") : nullptr;
        if (ostate) {
          for (std::size_t i = 0; i < shapes.size(); ++i) {
            const std::string& name = strategy_.specs()[i].name;
            ValuePtr per = ostate->get(name);
            if (!per) continue;
            for (auto& [key, t] : optimizer_->state()[name]) {
              ValuePtr node = per->get(key);
              if (!node) throw PlanError(fmt::format("{}: optimizer state of \"{}\" has no \"{}\"", ckpt_path, name, key));
              if (t.dim() == 0) {
                const torchfile::TensorInfo* info = tf->tensor_of(*node);
                if (!info) throw FormatError(fmt::format("{}: {}.{} is not a tensor", ckpt_path, name, key));
                tf->read_tensor(*info, std::span<std::byte>(static_cast<std::byte*>(t.data_ptr()), 4));
              } else {
                read_piece(*tf, *node, name + "." + key, shapes[i], t, rank, world);
              }
            }
          }
        }
        start = meta_int(root, "global_step");
        if (auto sp = root.get("shardpoint")) options_.global_batch = meta_int(*sp, "global_batch");
      } catch (...) {
        error = std::current_exception();
      }
      comm.rethrow_if_any_failed(error);
    }
    result.load_seconds = seconds_since(t0);
    if (options_.progress && rank == 0) {
      std::printf("loaded %s checkpoint %s (global_step %lld) in %.3f s\n", kind.c_str(), ckpt_path.c_str(),
                  static_cast<long long>(start), result.load_seconds);
      std::fflush(stdout);
    }
  }
  result.start_step = start;

  // 4. train
  for (std::int64_t step = start; step < options_.max_steps; ++step) {
    const auto t0 = Clock::now();
    const double loss = run_step(strategy_, *optimizer_, model, data, step, options_.global_batch, options_.seed);
    const double dt = seconds_since(t0);
    result.losses.push_back(loss);
    if (options_.progress && rank == 0) {
      std::printf("step %lld/%lld  loss %.4f  %.0f tokens/s\n", static_cast<long long>(step + 1),
                  static_cast<long long>(options_.max_steps), loss,
                  static_cast<double>(options_.global_batch * kBlockSize) / dt);
      std::fflush(stdout);
    }
  }

  // 5. checkpoint
  const std::int64_t step = std::max(start, options_.max_steps);
  const std::int64_t epoch = step > 0 ? epoch_of_step(step - 1, options_.global_batch, data.size()) : 0;
  const std::string path = (fs::path(dirpath) / fmt::format("epoch={}-step={}.ckpt", epoch, step)).string();
  const at::Tensor kth = at::full({}, std::numeric_limits<float>::infinity(), at::kFloat);
  const auto t0 = Clock::now();
  const auto shapes = strategy_.global_shapes();
  if (strategy_.state_dict_type() == "sharded") {
    if (rank == 0 && fs::is_regular_file(path)) fs::remove(path);
    comm.barrier();
    engine::StateDict root;
    root.emplace_back("model", strategy_.model_state());
    root.emplace_back("optimizer_0", optimizer_->state_dict(shapes, rank, world));
    auto st = storage::open_storage(path);
    engine::SaveReport report = engine::save(engine::StateNode(std::move(root)), *st, comm);
    result.checkpoint_bytes = report.bytes_written;
    std::exception_ptr error;
    if (rank == 0) {
      try {
        engine::StateNode meta(meta_entries(options_, epoch, step, path, dirpath, kth, data.size()));
        result.checkpoint_bytes += write_torch_file(meta, (fs::path(path) / "meta.pt").string());
      } catch (...) {
        error = std::current_exception();
      }
    }
    comm.rethrow_if_any_failed(error);
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
      bool scalar = false;
      for (const auto& name : strategy_.names()) {
        at::Tensor t = optimizer_->state()[name][key];
        scalar = t.dim() == 0;
        pieces.push_back(t);
      }
      if (scalar) {
        for (std::size_t i = 0; i < pieces.size(); ++i) full_state[strategy_.names()[i]][key] = pieces[i];
        continue;
      }
      std::vector<at::Tensor> gathered = strategy_.all_gather(pieces);
      for (std::size_t i = 0; i < gathered.size(); ++i) full_state[strategy_.names()[i]][key] = gathered[i];
    }
    std::exception_ptr error;
    if (rank == 0) {
      try {
        if (fs::is_directory(path)) {
          if (!fs::is_regular_file(fs::path(path) / "meta.pt")) {
            throw UsageError(fmt::format("The checkpoint path exists and is a directory: {}", path));
          }
          fs::remove_all(path);
        }
        engine::StateDict meta = meta_entries(options_, epoch, step, path, dirpath, kth, data.size());
        engine::StateDict root;
        for (std::size_t i = 0; i < 3; ++i) root.push_back(std::move(meta[i]));
        engine::StateDict sd;
        for (std::size_t i = 0; i < full.size(); ++i) sd.emplace_back(strategy_.names()[i], engine::StateNode(torchx::whole_of(full[i])));
        root.emplace_back("state_dict", engine::StateNode(std::move(sd)));
        for (std::size_t i = 3; i < meta.size(); ++i) {
          if (meta[i].first == "lr_schedulers") {
            engine::StateNode opt = optimizer_->state_dict(shapes, 0, 1);  // param_groups
            engine::StateDict od;
            engine::StateDict st;
            for (auto& [name, per] : full_state) {
              engine::StateDict pd;
              for (auto& [key, t] : per) pd.emplace_back(key, engine::StateNode(torchx::whole_of(t)));
              st.emplace_back(name, engine::StateNode(std::move(pd)));
            }
            od.emplace_back("state", engine::StateNode(std::move(st)));
            od.emplace_back("param_groups", std::move(*opt.find("param_groups")));
            engine::StateList opts;
            opts.emplace_back(std::move(od));
            root.emplace_back("optimizer_states", engine::StateNode(std::move(opts)));
          }
          root.push_back(std::move(meta[i]));
        }
        result.checkpoint_bytes = write_torch_file(engine::StateNode(std::move(root)), path);
      } catch (...) {
        error = std::current_exception();
      }
    }
    comm.rethrow_if_any_failed(error);
  }
  result.save_seconds = seconds_since(t0);
  result.checkpoint_path = path;
  if (options_.progress && rank == 0) {
    std::printf("saved %s checkpoint %s in %.3f s\n", strategy_.state_dict_type().c_str(), path.c_str(),
                result.save_seconds);
    std::fflush(stdout);
  }
  return result;
}

}  // namespace shardpoint::train
