// Optimizers that step on this rank's dim-0 parameter shards (FSDP2 style): SGD (optional
// momentum, dampening 0, no Nesterov), Adam and AdamW. The update math is PyTorch's
// single-tensor ("for-loop") formulas, elementwise, so stepping on shards gives the same
// values as stepping on the full tensors:
//   SGD:   g += wd * p;  buf = g (first step) or momentum * buf + g;  p -= lr * buf (or g)
//   Adam:  step += 1;  g += wd * p (Adam) or p *= 1 - lr * wd (AdamW);
//          m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//          p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
// State is kept as PyTorch names it ("momentum_buffer"; "step", "exp_avg", "exp_avg_sq"),
// "step" as a 0-dim float32 tensor replicated on every rank. Thread-compatible.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "shardpoint/state_dict.h"

namespace shardpoint::train {

struct OptimizerConfig {
  std::string name = "sgd";  // "sgd", "adam" or "adamw"
  double lr = 0.1;           // the demo's SGD(lr=0.1)
  double momentum = 0;       // SGD only
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam/AdamW
};

// Throws UsageError naming the legal names for an unknown optimizer.
OptimizerConfig optimizer_config(const std::string& name, double lr);

class ShardedOptimizer {
 public:
  ShardedOptimizer(OptimizerConfig config, std::vector<std::string> names);

  const OptimizerConfig& config() const { return config_; }

  // One step: params[i] -= update(grads[i]). Both are local shards, same shapes.
  void step(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads);

  // Creates zero state for every parameter that has none (shapes of the local shards), so
  // a template for loading exists before the first step. SGD without momentum has none.
  void ensure_state(const std::vector<at::Tensor>& params);

  // The optimizer state dict as Lightning's FSDP sharded checkpoint holds it under
  // "optimizer_<i>": {"state": {fqn: {...}}, "param_groups": [{..., "params": [fqn, ...]}]}.
  // "state" is omitted when empty (DCP drops empty mappings). Tensor leaves alias this
  // object's state (dim-0 boxes of this rank); global_shapes in names() order.
  engine::StateNode state_dict(const std::vector<engine::Shape>& global_shapes, int rank, int world_size);

  // The per-parameter state tensors, keyed by FQN then state name.
  std::map<std::string, std::map<std::string, at::Tensor>>& state() { return state_; }

 private:
  OptimizerConfig config_;
  std::vector<std::string> names_;
  std::map<std::string, std::map<std::string, at::Tensor>> state_;
};

}  // namespace shardpoint::train
