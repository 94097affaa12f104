// FSDPStrategy: fully sharded data parallel on CPU, FSDP2 style. Every parameter is cut on
// dim 0 into W pieces (DTensor Shard(0): chunk = ceil(n0 / W), the last pieces may be short
// or empty) and rank r keeps piece r and the optimizer state of that piece. A training step:
//   1. (all ranks) all-gather: every rank's pieces, packed into one message, are exchanged
//      (Communicator::all_gather) and the full parameters rebuilt, requiring grad;
//   2. (all ranks) forward + backward on this rank's data (the caller);
//   3. (all ranks) reduce-scatter of the gradients: for each rank r, the rows of every
//      gradient that r owns are packed and gathered on r (Communicator::gather, root r);
//      r sums them in rank order (deterministic) and scales them (1 / global tokens);
//   4. (all ranks) the optimizer steps on the local pieces (sharded_optimizer.h).
// Collectives go through shardpoint's Communicator (comm/), so the same code runs on the
// in-process ThreadGroup in tests and on c10d ProcessGroupGloo + TCPStore (sp_comm_gloo,
// chosen by make_communicator_from_env() from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) or
// MPI across processes. Messages are bytes: simple and exact, not the fastest path.
//
// StateDictType decides only how checkpoints are written; loading accepts either
// (Lightning's rule, docs/lightning-layout.md §1).
// Thread-compatible; every method marked (all ranks) is a collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>
#include <vector>

#include "shardpoint/communicator.h"
#include "shardpoint/state_dict.h"
#include "train/model.h"

namespace shardpoint::train {

// How checkpoints are written: Lightning's FSDPStrategy(state_dict_type=...).
enum class StateDictType {
  kFull,     // one torch.save file gathered on rank 0 (Lightning Trainer's default)
  kSharded,  // a DCP folder written by every rank, plus meta.pt
};

// "full" or "sharded": Lightning's spelling, used on the command line and in messages.
std::string_view state_dict_type_name(StateDictType type);
// The inverse of state_dict_type_name. Throws UsageError naming the two legal values for
// anything else.
StateDictType parse_state_dict_type(std::string_view name);

class FSDPStrategy {
 public:
  explicit FSDPStrategy(StateDictType state_dict_type = StateDictType::kFull) : state_dict_type_(state_dict_type) {}

  StateDictType state_dict_type() const { return state_dict_type_; }

  // Keeps this rank's dim-0 piece of every full initial parameter (same values on every
  // rank). REQUIRES specs and full_params in the same order and shapes.
  void setup(comm::Communicator& comm, std::vector<ParamSpec> specs, const std::vector<at::Tensor>& full_params);

  comm::Communicator& comm() const { return *comm_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  std::vector<std::string> names() const;
  std::vector<engine::Shape> global_shapes() const;
  // This rank's pieces (CPU, contiguous float32), in specs order. Modifying them in place
  // is how the optimizer and a checkpoint load update the model.
  std::vector<at::Tensor>& local_params() { return local_; }

  // (all ranks) Step 1: full parameters, leaf tensors requiring grad.
  std::vector<at::Tensor> all_gather_params();

  // (all ranks) Step 3: this rank's pieces of sum_over_ranks(full[i].grad()) * scale.
  // A full parameter without a gradient counts as zeros.
  std::vector<at::Tensor> reduce_scatter_grads(const std::vector<at::Tensor>& full, double scale);

  // (all ranks) The full value of every parameter on every rank (all_gather_params without
  // autograd); used for "full" checkpoints and tests.
  std::vector<at::Tensor> full_params();

  // (all ranks) all-gather of arbitrary local pieces laid out like the parameters (e.g.
  // optimizer state): returns full tensors.
  std::vector<at::Tensor> all_gather(const std::vector<at::Tensor>& pieces);

  // The model state {"model.embedding.weight": shard, ...} aliasing local_params().
  engine::StateNode model_state();

 private:
  StateDictType state_dict_type_;
  comm::Communicator* comm_ = nullptr;
  std::vector<ParamSpec> specs_;
  std::vector<at::Tensor> local_;
};

}  // namespace shardpoint::train
