#include "train/fsdp_strategy.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cstring>

#include <fmt/format.h>

#include "shardpoint/error.h"
#include "torch/tensor_adapter.h"

namespace shardpoint::train {
namespace {

std::vector<std::int64_t> dims(const engine::Shape& s) { return {s.begin(), s.end()}; }

// Appends the bytes of t (contiguous) to out.
void append_bytes(std::string& out, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  out.append(static_cast<const char*>(c.data_ptr()), static_cast<std::size_t>(c.numel()) * c.element_size());
}

}  // namespace

std::string_view state_dict_type_name(StateDictType type) {
  return type == StateDictType::kSharded ? "sharded" : "full";
}

StateDictType parse_state_dict_type(std::string_view name) {
  if (name == "full") return StateDictType::kFull;
  if (name == "sharded") return StateDictType::kSharded;
  throw UsageError(fmt::format("Unknown state_dict_type: \"{}\" (expected \"full\" or \"sharded\")", name));
}

void FSDPStrategy::setup(comm::Communicator& comm, std::vector<ParamSpec> specs,
                         const std::vector<at::Tensor>& full_params) {
  if (specs.size() != full_params.size()) {
    throw UsageError(fmt::format("FSDPStrategy::setup: {} specs, {} parameters", specs.size(), full_params.size()));
  }
  comm_ = &comm;
  specs_ = std::move(specs);
  local_.clear();
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (torchx::shape_of(full_params[i]) != specs_[i].shape) {
      throw UsageError(fmt::format("{}: parameter is {}, expected {}", specs_[i].name,
                                   engine::shape_to_string(torchx::shape_of(full_params[i])),
                                   engine::shape_to_string(specs_[i].shape)));
    }
    local_.push_back(torchx::dim0_slice(full_params[i].to(at::kFloat), comm.rank(), comm.world_size()));
  }
}

std::vector<std::string> FSDPStrategy::names() const {
  std::vector<std::string> out;
  for (const auto& s : specs_) out.push_back(s.name);
  return out;
}

std::vector<engine::Shape> FSDPStrategy::global_shapes() const {
  std::vector<engine::Shape> out;
  for (const auto& s : specs_) out.push_back(s.shape);
  return out;
}

std::vector<at::Tensor> FSDPStrategy::all_gather(const std::vector<at::Tensor>& pieces) {
  const int world = comm_->world_size();
  std::string mine;
  for (const auto& p : pieces) append_bytes(mine, p);
  const std::vector<std::string> all = comm_->all_gather(std::move(mine));
  std::vector<at::Tensor> full;
  for (std::size_t i = 0; i < pieces.size(); ++i) full.push_back(at::empty(dims(specs_[i].shape), pieces[i].options()));
  for (int r = 0; r < world; ++r) {
    std::size_t pos = 0;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const engine::Box box = torchx::dim0_box(specs_[i].shape, r, world);
      const std::size_t n = static_cast<std::size_t>(engine::volume(box.sizes)) * full[i].element_size();
      if (pos + n > all[r].size()) {
        throw CommError(fmt::format("all-gather: rank {} sent {} bytes, fewer than its pieces need", r, all[r].size()));
      }
      if (n > 0) {
        at::Tensor dst = full[i].dim() == 0 ? full[i] : full[i].narrow(0, box.offsets[0], box.sizes[0]);
        std::memcpy(dst.data_ptr(), all[r].data() + pos, n);
      }
      pos += n;
    }
  }
  return full;
}

std::vector<at::Tensor> FSDPStrategy::all_gather_params() {
  std::vector<at::Tensor> full = all_gather(local_);
  for (auto& t : full) t.set_requires_grad(true);
  return full;
}

std::vector<at::Tensor> FSDPStrategy::full_params() { return all_gather(local_); }

std::vector<at::Tensor> FSDPStrategy::reduce_scatter_grads(const std::vector<at::Tensor>& full, double scale) {
  at::NoGradGuard no_grad;
  const int world = comm_->world_size(), rank = comm_->rank();
  std::vector<at::Tensor> grads;
  for (std::size_t i = 0; i < full.size(); ++i) {
    grads.push_back(full[i].grad().defined() ? full[i].grad() : at::zeros_like(full[i]));
  }
  std::vector<std::string> received;
  for (int dst = 0; dst < world; ++dst) {
    std::string piece;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const engine::Box box = torchx::dim0_box(specs_[i].shape, dst, world);
      append_bytes(piece, grads[i].dim() == 0 ? grads[i] : grads[i].narrow(0, box.offsets[0], box.sizes[0]));
    }
    std::vector<std::string> got = comm_->gather(std::move(piece), dst);
    if (dst == rank) received = std::move(got);
  }
  std::vector<at::Tensor> out;
  std::size_t pos = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    at::Tensor acc = at::zeros_like(local_[i]);
    const std::size_t n = static_cast<std::size_t>(acc.numel()) * acc.element_size();
    for (int r = 0; r < world; ++r) {  // rank order: the same sum on every run
      if (pos + n > received[r].size()) throw CommError(fmt::format("reduce-scatter: short message from rank {}", r));
      if (n > 0) {
        at::Tensor part = at::empty_like(acc);
        std::memcpy(part.data_ptr(), received[r].data() + pos, n);
        acc.add_(part);
      }
    }
    pos += n;
    out.push_back(acc.mul_(scale));
  }
  return out;
}

engine::StateNode FSDPStrategy::model_state() {
  std::vector<torchx::NamedShard> shards;
  for (std::size_t i = 0; i < specs_.size(); ++i) shards.push_back({specs_[i].name, local_[i], specs_[i].shape});
  return torchx::dim0_sharded_state(shards, comm_->rank(), comm_->world_size());
}

}  // namespace shardpoint::train
