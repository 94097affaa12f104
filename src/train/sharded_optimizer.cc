#include "train/sharded_optimizer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include <fmt/format.h>

#include "shardpoint/error.h"
#include "shardpoint/pickle_value.h"
#include "torch/tensor_adapter.h"

namespace shardpoint::train {

using pickle::Value;

OptimizerConfig optimizer_config(const std::string& name, double lr) {
  OptimizerConfig c;
  if (name != "sgd" && name != "adam" && name != "adamw") {
    throw UsageError(fmt::format("unknown optimizer \"{}\" (expected sgd, adam or adamw)", name));
  }
  c.name = name;
  c.lr = lr;
  if (name == "adamw") c.weight_decay = 0.01;  // torch.optim.AdamW's default
  return c;
}

ShardedOptimizer::ShardedOptimizer(OptimizerConfig config, std::vector<std::string> names)
    : config_(std::move(config)), names_(std::move(names)) {}

void ShardedOptimizer::ensure_state(const std::vector<at::Tensor>& params) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto& s = state_[names_[i]];
    if (config_.name == "sgd") {
      if (config_.momentum != 0 && !s.count("momentum_buffer")) s["momentum_buffer"] = at::zeros_like(params[i]);
    } else if (!s.count("step")) {
      s["step"] = at::zeros({}, at::kFloat);
      s["exp_avg"] = at::zeros_like(params[i]);
      s["exp_avg_sq"] = at::zeros_like(params[i]);
    }
  }
}

void ShardedOptimizer::step(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  at::NoGradGuard no_grad;
  ensure_state(params);
  const auto& c = config_;
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    at::Tensor g = grads[i];
    auto& s = state_[names_[i]];
    if (c.name == "sgd") {
      if (c.weight_decay != 0) g = g.add(p, c.weight_decay);
      if (c.momentum != 0) {
        // ensure_state() starts the buffer at zero: momentum * 0 + g equals torch's first-step
        // copy of the gradient because dampening is 0.
        at::Tensor& buf = s["momentum_buffer"];
        buf.mul_(c.momentum).add_(g);
        g = buf;
      }
      p.add_(g, -c.lr);
      continue;
    }
    at::Tensor& step = s["step"];
    step.add_(1);
    const double t = step.item<float>();
    if (c.weight_decay != 0) {
      if (c.name == "adamw") p.mul_(1 - c.lr * c.weight_decay);
      else g = g.add(p, c.weight_decay);
    }
    at::Tensor& m = s["exp_avg"];
    at::Tensor& v = s["exp_avg_sq"];
    m.mul_(c.beta1).add_(g, 1 - c.beta1);
    v.mul_(c.beta2).addcmul_(g, g, 1 - c.beta2);
    const double bc1 = 1 - std::pow(c.beta1, t);
    const double bc2 = 1 - std::pow(c.beta2, t);
    at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(c.eps);
    p.addcdiv_(m, denom, -c.lr / bc1);
  }
}

engine::StateNode ShardedOptimizer::state_dict(const std::vector<engine::Shape>& global_shapes, int rank,
                                               int world_size) {
  const auto& c = config_;
  engine::StateDict state;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    auto it = state_.find(names_[i]);
    if (it == state_.end() || it->second.empty()) continue;
    engine::StateDict per;
    for (auto& [key, t] : it->second) {
      if (t.dim() == 0) {
        per.emplace_back(key, engine::StateNode(torchx::whole_of(t)));
      } else {
        const engine::Box box = torchx::dim0_box(global_shapes[i], rank, world_size);
        per.emplace_back(key, engine::StateNode(torchx::shard_of(t, global_shapes[i], box.offsets)));
      }
    }
    state.emplace_back(names_[i], engine::StateNode(std::move(per)));
  }
  engine::StateDict group;
  auto f = [](double v) { return engine::StateNode(Value::floating(v)); };
  auto b = [](bool v) { return engine::StateNode(Value::boolean(v)); };
  group.emplace_back("lr", f(c.lr));
  if (c.name == "sgd") {
    group.emplace_back("momentum", f(c.momentum));
    group.emplace_back("dampening", f(0));
    group.emplace_back("weight_decay", f(c.weight_decay));
    group.emplace_back("nesterov", b(false));
  } else {
    group.emplace_back("betas", engine::StateNode(Value::tuple({Value::floating(c.beta1), Value::floating(c.beta2)})));
    group.emplace_back("eps", f(c.eps));
    group.emplace_back("weight_decay", f(c.weight_decay));
    group.emplace_back("amsgrad", b(false));
  }
  group.emplace_back("maximize", b(false));
  group.emplace_back("foreach", engine::StateNode(Value::none()));
  group.emplace_back("differentiable", b(false));
  std::vector<pickle::ValuePtr> params;
  for (const auto& n : names_) params.push_back(Value::str(n));
  group.emplace_back("params", engine::StateNode(Value::list(std::move(params))));
  engine::StateDict out;
  if (!state.empty()) out.emplace_back("state", engine::StateNode(std::move(state)));
  engine::StateList groups;
  groups.emplace_back(std::move(group));
  out.emplace_back("param_groups", engine::StateNode(std::move(groups)));
  return engine::StateNode(std::move(out));
}

}  // namespace shardpoint::train
