// The demo Transformer language model of Lightning's `lightning.pytorch.demos.transformer`
// (docs/lightning-layout.md §6.1), written with ATen ops: same architecture, module
// names, parameter order and shapes, so its state dict has Lightning's LightningTransformer
// keys (`model.embedding.weight`, `model.transformer.encoder.layers.0.self_attn.in_proj_weight`,
// ..., 67 tensors at the defaults).
//
// Deliberate differences from the demo's forward pass (the parameters are the same):
//   - real sinusoidal positional encoding: token t gets pe[t] (the demo adds pe[T] to every
//     token since Lightning 2.5, and nothing before 2.4);
//   - no target leakage: the decoder reads the *inputs* (not the targets), and the encoder
//     self-attention, decoder self-attention and cross-attention are all causal, so position
//     t sees tokens <= t only. The demo feeds the targets to the decoder with a causal mask
//     that includes the diagonal, so position t sees its own label and the loss collapses.
//   - dropout draws from a generator the caller passes (seeded per data block), so a run
//     is reproducible and independent of the world size.
// Initialisation follows the demo: embedding and decoder weight U(-0.1, 0.1), decoder bias
// 0, nn.Transformer's xavier_uniform_ on every matrix inside `transformer`, LayerNorm 1/0,
// attention biases 0, Linear biases U(+-1/sqrt(fan_in)).
// Thread-compatible; the forward pass records autograd history on the given parameters.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardpoint/metadata.h"

namespace shardpoint::train {

using format::Shape;

struct ModelConfig {
  std::int64_t vocab_size = 33278;  // WikiText-2's vocabulary (the demo's default)
  std::int64_t ninp = 200;          // embedding size (d_model)
  std::int64_t nhead = 2;
  std::int64_t nhid = 200;   // feed-forward size
  std::int64_t nlayers = 2;  // encoder layers and decoder layers
  double dropout = 0.2;
};

// "tiny" (ninp 32, 2 heads, nhid 64, 2+2 layers: 67 tensors, for tests), "demo" (the
// defaults above) or "1b-shape" (the Fabric docs' 1B configuration: ninp 1024, 64 heads,
// nhid 4096, 32+32 layers). vocab_size is set by the caller. Throws UsageError otherwise.
ModelConfig model_config(const std::string& size);

struct ParamSpec {
  std::string name;  // LightningModule FQN, e.g. "model.embedding.weight"
  Shape shape;
};

// Every parameter in state-dict order (module registration order, as PyTorch lists them).
std::vector<ParamSpec> param_specs(const ModelConfig& config);

// The full initial value of every parameter (same order), drawn from a CPU generator seeded
// with `seed`: the same on every rank.
std::vector<at::Tensor> init_params(const ModelConfig& config, std::uint64_t seed);

// Sum (not mean) of the next-token negative log-likelihood over the batch:
// inputs, targets are int64 [B, T]; params are full tensors in param_specs order.
// `training` enables dropout, drawn from `gen`. Returns a 0-dim float tensor that
// carries autograd history when the params require grad.
at::Tensor loss_sum(const ModelConfig& config, const std::vector<at::Tensor>& params, const at::Tensor& inputs,
                    const at::Tensor& targets, bool training, at::Generator& gen);

}  // namespace shardpoint::train
