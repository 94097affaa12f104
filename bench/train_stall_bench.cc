// train_stall_bench: one rank of the training-stall benchmark (bench/train_stall_bench.py
// launches N of them with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; Gloo then).
//
//   train_stall_bench sync|async|full DIR --spec FILE [--checkpoints 3]
//
// FILE lists the model's parameters, one "name d0 [d1 ...]" per line (train_stall_bench.py
// writes it from src/train/model.cc's param_specs for the chosen model size). The state is
// the trainer's sharded layout: {"model": {name: w}, "optimizer_0": {"state": {name:
// {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [{...}]}}, every tensor float32 and
// Shard(0) over the ranks (FSDPStrategy's dim-0 split, DTensor's ceil rule), `step` a
// replicated 0-dim tensor. Values are a cheap pattern (no training).
//
// Each checkpoint k (0-based) of the run is written to DIR/ckpt<k> (DIR/ckpt<k>.pt for
// full) after a barrier; between checkpoints one element of every tensor changes (a
// "training step"). Modes:
//   sync   engine::save(); stall = the call.
//   async  engine::async_save() over one StagingPool kept for the run; stall = until it
//          returns; then PendingSave::wait(): committed = from the start to wait()'s return.
//   full   the trainer's "full" checkpoint: every tensor gathered on rank 0, written there
//          as one torch.save file (engine/torch_save.h, O_DIRECT, fsync); stall = until the
//          final barrier.
// Prints one JSON line: {"rank", "world_size", "own_bytes", "stall": [s per checkpoint],
// "committed": [...], async only: "plan" and "copy" [s per checkpoint], "peak_rss", "rss_before", "staging_bytes",
// "bytes_written"}. Exit codes: 0 ok, 2 an exception.
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "engine/chunking.h"
#include "engine/torch_save.h"
#include "shardpoint/async_save.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/communicator_from_env.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/storage_registry.h"

namespace sb = shardpoint::bench;
namespace se = shardpoint::engine;
using shardpoint::pickle::Value;

namespace {

struct Param {
  std::string name;
  se::Shape shape;
};

std::vector<Param> read_spec(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("train_stall_bench: cannot read " + path);
  std::vector<Param> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    Param p;
    if (!(fields >> p.name)) continue;
    std::int64_t d;
    while (fields >> d) p.shape.push_back(d);
    out.push_back(std::move(p));
  }
  return out;
}

struct Tensor {
  std::string key;
  se::Shape shape;  // global; empty for `step`
  se::Shape offsets, sizes;
  std::vector<float> data;  // this rank's rows
};

struct RankState {
  std::vector<Tensor> tensors;  // stable addresses once built
  se::StateNode root;
  std::uint64_t bytes = 0;
};

se::TensorShard shard_of(Tensor& t) {
  se::TensorShard s;
  s.dtype = shardpoint::DType::kFloat32;
  s.global_shape = t.shape;
  s.offsets = t.offsets;
  s.sizes = t.sizes;
  s.data = std::as_writable_bytes(std::span<float>(t.data));
  return s;
}

se::StateNode param_groups(const std::vector<Param>& params) {
  std::vector<shardpoint::pickle::ValuePtr> names;
  names.reserve(params.size());
  for (const auto& p : params) names.push_back(Value::str(p.name));
  se::StateDict group;
  group.emplace_back("lr", se::StateNode(Value::floating(1e-3)));
  group.emplace_back("betas", se::StateNode(Value::tuple({Value::floating(0.9), Value::floating(0.999)})));
  group.emplace_back("eps", se::StateNode(Value::floating(1e-8)));
  group.emplace_back("weight_decay", se::StateNode(Value::floating(0.0)));
  group.emplace_back("amsgrad", se::StateNode(Value::boolean(false)));
  group.emplace_back("params", se::StateNode(Value::list(std::move(names))));
  se::StateList groups;
  groups.emplace_back(std::move(group));
  return se::StateNode(std::move(groups));
}

RankState build(const std::vector<Param>& params, int rank, int world) {
  RankState st;
  for (const auto& p : params) {
    for (const std::string& key : {"model." + p.name, "optimizer_0.state." + p.name + ".exp_avg",
                                   "optimizer_0.state." + p.name + ".exp_avg_sq"}) {
      Tensor t;
      t.key = key;
      t.shape = p.shape;
      const auto box = se::shard_box(p.shape, {world}, {se::Placement::shard(0)}, {rank});
      t.offsets = box.offsets;
      t.sizes = box.sizes;
      t.data.resize(static_cast<std::size_t>(se::volume(box.sizes)));
      for (std::size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<float>(i % 1000) / 8.0f;  // faults it in
      st.bytes += t.data.size() * sizeof(float);
      st.tensors.push_back(std::move(t));
    }
    Tensor step;
    step.key = "optimizer_0.state." + p.name + ".step";
    step.data.assign(1, 10.0f);
    st.tensors.push_back(std::move(step));
  }
  se::StateDict model, opt_state;
  for (std::size_t i = 0, k = 0; k < params.size(); ++k, i += 4) {
    model.emplace_back(params[k].name, shard_of(st.tensors[i]));
    se::StateDict per;
    per.emplace_back("step", shard_of(st.tensors[i + 3]));
    per.emplace_back("exp_avg", shard_of(st.tensors[i + 1]));
    per.emplace_back("exp_avg_sq", shard_of(st.tensors[i + 2]));
    opt_state.emplace_back(params[k].name, se::StateNode(std::move(per)));
  }
  se::StateDict optimizer;
  optimizer.emplace_back("state", se::StateNode(std::move(opt_state)));
  optimizer.emplace_back("param_groups", param_groups(params));
  se::StateDict root;
  root.emplace_back("model", se::StateNode(std::move(model)));
  root.emplace_back("optimizer_0", se::StateNode(std::move(optimizer)));
  st.root = se::StateNode(std::move(root));
  return st;
}

void training_step(RankState& st) {
  for (Tensor& t : st.tensors) {
    if (!t.data.empty()) t.data[0] += 1.0f;
  }
}

// The trainer's full checkpoint: every tensor gathered on rank 0 and written there as one
// torch.save file (Lightning's full layout is a different tree of the same tensors).
// Returns the bytes rank 0 wrote (0 elsewhere).
std::uint64_t save_full(RankState& st, const std::vector<Param>& params, shardpoint::storage::Storage& folder,
                        const std::string& name, shardpoint::comm::Communicator& comm) {
  std::vector<std::vector<float>> full;  // rank 0: whole tensors, in st.tensors order
  for (Tensor& t : st.tensors) {
    if (t.shape.empty()) {
      if (comm.is_coordinator()) full.push_back(t.data);
      continue;
    }
    std::vector<std::string> pieces =
        comm.gather(std::string(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(float)));
    if (!comm.is_coordinator()) continue;
    std::vector<float> whole(static_cast<std::size_t>(se::volume(t.shape)));
    std::size_t at = 0;
    for (const std::string& piece : pieces) {  // dim-0 pieces in rank order: concatenation
      std::memcpy(reinterpret_cast<char*>(whole.data()) + at, piece.data(), piece.size());
      at += piece.size();
    }
    full.push_back(std::move(whole));
  }
  std::uint64_t written = 0;
  if (comm.is_coordinator()) {
    auto whole_shard = [](std::vector<float>& data, const se::Shape& shape) {
      se::TensorShard s;
      s.dtype = shardpoint::DType::kFloat32;
      s.global_shape = shape;
      s.offsets = se::Shape(shape.size(), 0);
      s.sizes = shape;
      s.data = std::as_writable_bytes(std::span<float>(data));
      return s;
    };
    se::StateDict model, opt_state;
    for (std::size_t i = 0, k = 0; k < params.size(); ++k, i += 4) {
      model.emplace_back(params[k].name, whole_shard(full[i], params[k].shape));
      se::StateDict per;
      per.emplace_back("step", whole_shard(full[i + 3], {}));
      per.emplace_back("exp_avg", whole_shard(full[i + 1], params[k].shape));
      per.emplace_back("exp_avg_sq", whole_shard(full[i + 2], params[k].shape));
      opt_state.emplace_back(params[k].name, se::StateNode(std::move(per)));
    }
    se::StateDict optimizer;
    optimizer.emplace_back("state", se::StateNode(std::move(opt_state)));
    optimizer.emplace_back("param_groups", param_groups(params));
    se::StateDict root;
    root.emplace_back("state_dict", se::StateNode(std::move(model)));
    root.emplace_back("optimizer_states", se::StateNode(se::StateList{se::StateNode(std::move(optimizer))}));
    shardpoint::storage::WriteOptions wo;
    wo.durable = true;
    wo.direct_io = true;
    auto writer = folder.open_writer(name, wo);
    se::write_torch_save(se::StateNode(std::move(root)), *writer);
    written = writer->position();
    writer->commit();
  }
  comm.barrier();
  return written;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: train_stall_bench sync|async|full DIR --spec FILE [--checkpoints N]\n";
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  std::string spec;
  int checkpoints = 3;
  for (int a = 3; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--spec" && a + 1 < argc) spec = argv[++a];
    else if (arg == "--checkpoints" && a + 1 < argc) checkpoints = std::stoi(argv[++a]);
    else {
      std::cerr << "train_stall_bench: unknown argument " << arg << "\n";
      return 2;
    }
  }
  try {
    auto comm = shardpoint::comm::make_communicator_from_env(shardpoint::comm::CommOptions{std::chrono::seconds(900)});
    const int rank = comm->rank(), world = comm->world_size();
    const std::vector<Param> params = read_spec(spec);
    RankState st = build(params, rank, world);
    auto folder = shardpoint::storage::open_storage(dir);
    se::StagingPool staging;
    nlohmann::ordered_json out;
    out["rank"] = rank;
    out["world_size"] = world;
    out["own_bytes"] = st.bytes;
    out["rss_before"] = sb::proc_status_bytes("VmRSS");
    sb::reset_peak_rss();
    std::vector<double> stall, committed, plan, copy;
    std::uint64_t written = 0;
    for (int k = 0; k < checkpoints; ++k) {
      if (k > 0) training_step(st);
      const std::string name = "ckpt" + std::to_string(k);
      std::string path = dir;
      path += '/';
      path += name;
      comm->barrier();
      const double t0 = sb::now_seconds();
      if (mode == "sync") {
        auto target = shardpoint::storage::open_storage(path);
        written = se::save(st.root, *target, *comm).bytes_written;
        stall.push_back(sb::now_seconds() - t0);
        committed.push_back(stall.back());
      } else if (mode == "async") {
        auto target = shardpoint::storage::open_storage(path);
        se::AsyncSaveOptions options;
        options.staging = &staging;
        auto pending = se::async_save(st.root, *target, *comm, options);
        stall.push_back(sb::now_seconds() - t0);
        plan.push_back(pending->report().plan_seconds);
        copy.push_back(pending->report().copy_seconds);
        training_step(st);  // the caller's tensors change while the files are written
        written = pending->wait().bytes_written;
        committed.push_back(sb::now_seconds() - t0);
      } else if (mode == "full") {
        written = save_full(st, params, *folder, name + ".pt", *comm);
        stall.push_back(sb::now_seconds() - t0);
        committed.push_back(stall.back());
      } else {
        std::cerr << "train_stall_bench: mode must be sync, async or full\n";
        return 2;
      }
    }
    out["stall"] = stall;
    out["committed"] = committed;
    if (mode == "async") {
      out["plan"] = plan;
      out["copy"] = copy;
    }
    out["peak_rss"] = sb::proc_status_bytes("VmHWM");
    out["staging_bytes"] = staging.held_bytes();
    out["bytes_written"] = written;
    std::cout << out.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "train_stall_bench: " << e.what() << "\n";
    return 2;
  }
}
