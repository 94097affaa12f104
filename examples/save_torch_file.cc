// save_torch_file OUT.pt: writes a small training state (a 2-layer MLP's weights, Adam
// moments, step counters, hyper-parameters) as one torch.save file with shardpoint's C++
// API, no Python involved. `make demo` loads it with PyTorch afterwards.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "engine/torch_save.h"
#include "shardpoint/pickle_value.h"
#include "shardpoint/state_dict.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"

using shardpoint::DType;
using shardpoint::engine::StateDict;
using shardpoint::engine::StateNode;
using shardpoint::engine::TensorShard;
using shardpoint::pickle::Value;

namespace {

// Owns the tensor memory the state tree points at.
struct Buffers {
  std::vector<std::vector<float>> tensors;

  TensorShard tensor(const std::vector<std::int64_t>& shape, float scale) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    auto& data = tensors.emplace_back(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = scale * std::sin(static_cast<float>(i));
    TensorShard t;
    t.dtype = DType::kFloat32;
    t.global_shape = shape;
    t.offsets.assign(shape.size(), 0);
    t.sizes = shape;
    t.data = std::as_writable_bytes(std::span(data));
    return t;
  }
};

}  // namespace

// Builds the state and writes it to `out`; throws on failure.
void save_example(const std::filesystem::path& out) {
  Buffers buffers;
  StateDict model = {{"fc1.weight", buffers.tensor({64, 32}, 0.1f)},
                     {"fc1.bias", buffers.tensor({64}, 0.01f)},
                     {"fc2.weight", buffers.tensor({10, 64}, 0.1f)},
                     {"fc2.bias", buffers.tensor({10}, 0.01f)}};
  StateDict optimizer_state;
  for (auto& [name, node] : model) {
    const TensorShard& p = node.tensor();
    StateDict moments = {{"step", StateNode(Value::floating(100.0))},
                         {"exp_avg", buffers.tensor(p.global_shape, 0.001f)},
                         {"exp_avg_sq", buffers.tensor(p.global_shape, 0.0001f)}};
    optimizer_state.emplace_back(name, StateNode(std::move(moments)));
  }
  auto param_group =
      Value::dict({{Value::str("lr"), Value::floating(3e-4)},
                   {Value::str("betas"), Value::tuple({Value::floating(0.9), Value::floating(0.999)})},
                   {Value::str("params"), Value::list({Value::str("fc1.weight"), Value::str("fc1.bias"),
                                                       Value::str("fc2.weight"), Value::str("fc2.bias")})}});
  StateDict root = {
      {"state_dict", StateNode(std::move(model))},
      {"optimizer_states", StateNode(std::vector<StateNode>{
                               StateNode(StateDict{{"state", StateNode(std::move(optimizer_state))},
                                                   {"param_groups", StateNode(Value::list({param_group}))}})})},
      {"epoch", StateNode(Value::integer(3))},
      {"global_step", StateNode(Value::integer(1200))},
      {"hyper_parameters", StateNode(Value::dict({{Value::str("hidden"), Value::integer(64)},
                                                  {Value::str("optimizer"), Value::str("adam")}}))},
  };
  auto storage = shardpoint::storage::open_storage(out.parent_path().string());
  auto writer = storage->open_writer(out.filename().string());
  shardpoint::engine::TorchSaveFileOptions options;
  options.archive_name = out.stem().string();
  shardpoint::engine::write_torch_save(StateNode(std::move(root)), *writer, options);
  writer->commit();
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: save_torch_file OUT.pt\n");
    return 2;
  }
  try {
    std::filesystem::path out = std::filesystem::absolute(argv[1]);
    save_example(out);
    std::printf("wrote %s (%llu bytes)\n", out.c_str(),
                static_cast<unsigned long long>(std::filesystem::file_size(out)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "save_torch_file: %s\n", e.what());
    return 1;
  }
  return 0;
}
