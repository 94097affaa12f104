#include "train/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Reduction.h>

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "shardpoint/error.h"

namespace shardpoint::train {
namespace {

void add_attention(std::vector<ParamSpec>& out, const std::string& p, std::int64_t e) {
  out.push_back({p + "in_proj_weight", {3 * e, e}});
  out.push_back({p + "in_proj_bias", {3 * e}});
  out.push_back({p + "out_proj.weight", {e, e}});
  out.push_back({p + "out_proj.bias", {e}});
}

void add_linear(std::vector<ParamSpec>& out, const std::string& p, std::int64_t in, std::int64_t outf) {
  out.push_back({p + "weight", {outf, in}});
  out.push_back({p + "bias", {outf}});
}

void add_norm(std::vector<ParamSpec>& out, const std::string& p, std::int64_t e) {
  out.push_back({p + "weight", {e}});
  out.push_back({p + "bias", {e}});
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

at::Tensor dropout(const at::Tensor& x, double p, bool training, at::Generator& gen) {
  if (!training || p <= 0) return x;
  at::Tensor mask = at::empty_like(x, at::TensorOptions().requires_grad(false)).bernoulli_(1.0 - p, gen);
  return x * mask / (1.0 - p);
}

// Reads the parameters in param_specs order.
struct ParamCursor {
  const std::vector<at::Tensor>& params;
  std::size_t next = 0;
  const at::Tensor& take() { return params.at(next++); }
};

struct Attention {
  at::Tensor in_w, in_b, out_w, out_b;
  explicit Attention(ParamCursor& c) : in_w(c.take()), in_b(c.take()), out_w(c.take()), out_b(c.take()) {}
};

// Multi-head attention with PyTorch's packed in_proj layout: rows [0,E) project the query,
// [E,2E) the key, [2E,3E) the value. mask is additive [T, S].
at::Tensor attention(const ModelConfig& cfg, const Attention& a, const at::Tensor& q_in, const at::Tensor& kv_in,
                     const at::Tensor& mask, bool training, at::Generator& gen) {
  const std::int64_t e = cfg.ninp, h = cfg.nhead, d = e / h;
  const std::int64_t b = q_in.size(0), t = q_in.size(1), s = kv_in.size(1);
  at::Tensor q = at::linear(q_in, a.in_w.narrow(0, 0, e), a.in_b.narrow(0, 0, e));
  at::Tensor k = at::linear(kv_in, a.in_w.narrow(0, e, e), a.in_b.narrow(0, e, e));
  at::Tensor v = at::linear(kv_in, a.in_w.narrow(0, 2 * e, e), a.in_b.narrow(0, 2 * e, e));
  q = q.view({b, t, h, d}).transpose(1, 2);
  k = k.view({b, s, h, d}).transpose(1, 2);
  v = v.view({b, s, h, d}).transpose(1, 2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d)) + mask;
  at::Tensor w = dropout(at::softmax(scores, -1), cfg.dropout, training, gen);
  at::Tensor o = at::matmul(w, v).transpose(1, 2).reshape({b, t, e});
  return at::linear(o, a.out_w, a.out_b);
}

at::Tensor layer_norm(ParamCursor& c, const at::Tensor& x, std::int64_t e) {
  const at::Tensor& w = c.take();
  const at::Tensor& b = c.take();
  return at::layer_norm(x, {e}, w, b, 1e-5);
}

at::Tensor feed_forward(const ModelConfig& cfg, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                        const at::Tensor& b2, const at::Tensor& x, bool training, at::Generator& gen) {
  return at::linear(dropout(at::relu(at::linear(x, w1, b1)), cfg.dropout, training, gen), w2, b2);
}

}  // namespace

ModelConfig model_config(const std::string& size) {
  ModelConfig c;
  if (size == "demo") return c;
  if (size == "tiny") {
    c.ninp = 32;
    c.nhead = 2;
    c.nhid = 64;
    c.nlayers = 2;
    return c;
  }
  if (size == "1b-shape") {
    c.ninp = 1024;
    c.nhead = 64;
    c.nhid = 4096;
    c.nlayers = 32;
    return c;
  }
  throw UsageError(fmt::format("unknown model size \"{}\" (expected tiny, demo or 1b-shape)", size));
}

std::vector<ParamSpec> param_specs(const ModelConfig& cfg) {
  const std::int64_t e = cfg.ninp, f = cfg.nhid;
  std::vector<ParamSpec> out;
  out.push_back({"model.embedding.weight", {cfg.vocab_size, e}});
  for (std::int64_t i = 0; i < cfg.nlayers; ++i) {
    const std::string p = fmt::format("model.transformer.encoder.layers.{}.", i);
    add_attention(out, p + "self_attn.", e);
    add_linear(out, p + "linear1.", e, f);
    add_linear(out, p + "linear2.", f, e);
    add_norm(out, p + "norm1.", e);
    add_norm(out, p + "norm2.", e);
  }
  add_norm(out, "model.transformer.encoder.norm.", e);
  for (std::int64_t i = 0; i < cfg.nlayers; ++i) {
    const std::string p = fmt::format("model.transformer.decoder.layers.{}.", i);
    add_attention(out, p + "self_attn.", e);
    add_attention(out, p + "multihead_attn.", e);
    add_linear(out, p + "linear1.", e, f);
    add_linear(out, p + "linear2.", f, e);
    add_norm(out, p + "norm1.", e);
    add_norm(out, p + "norm2.", e);
    add_norm(out, p + "norm3.", e);
  }
  add_norm(out, "model.transformer.decoder.norm.", e);
  add_linear(out, "model.decoder.", e, cfg.vocab_size);
  return out;
}

std::vector<at::Tensor> init_params(const ModelConfig& cfg, std::uint64_t seed) {
  if (cfg.ninp % cfg.nhead != 0) {
    throw UsageError(fmt::format("ninp {} is not a multiple of nhead {}", cfg.ninp, cfg.nhead));
  }
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> out;
  for (const ParamSpec& spec : param_specs(cfg)) {
    std::vector<std::int64_t> shape(spec.shape.begin(), spec.shape.end());
    at::Tensor t = at::empty(shape, at::kFloat);
    const std::string& n = spec.name;
    if (n == "model.embedding.weight" || n == "model.decoder.weight") {
      t.uniform_(-0.1, 0.1, gen);
    } else if (n == "model.decoder.bias" || ends_with(n, "in_proj_bias") || ends_with(n, "out_proj.bias") ||
               (n.find(".norm") != std::string::npos && ends_with(n, ".bias"))) {
      t.zero_();
    } else if (n.find(".norm") != std::string::npos) {
      t.fill_(1.0);
    } else if (t.dim() == 2) {  // xavier_uniform_ (nn.Transformer._reset_parameters)
      const double bound = std::sqrt(6.0 / static_cast<double>(t.size(0) + t.size(1)));
      t.uniform_(-bound, bound, gen);
    } else {  // Linear bias: U(+-1/sqrt(fan_in)); fan_in is the previous weight's columns
      const std::int64_t fan_in = out.back().size(1);
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      t.uniform_(-bound, bound, gen);
    }
    out.push_back(std::move(t));
  }
  return out;
}

at::Tensor loss_sum(const ModelConfig& cfg, const std::vector<at::Tensor>& params, const at::Tensor& inputs,
                    const at::Tensor& targets, bool training, at::Generator& gen) {
  const std::int64_t e = cfg.ninp, t = inputs.size(1);
  ParamCursor c{params};
  const at::Tensor& emb = c.take();
  // Sinusoidal positional encoding, position t -> pe[t] (base 10000).
  at::Tensor pos = at::arange(t, at::kFloat).unsqueeze(1);
  at::Tensor div = at::exp(at::arange(0, e, 2, at::kFloat) * (-std::log(10000.0) / static_cast<double>(e)));
  at::Tensor pe = at::zeros({t, e}, at::kFloat);
  pe.slice(1, 0, e, 2).copy_(at::sin(pos * div));
  pe.slice(1, 1, e, 2).copy_(at::cos(pos * div).narrow(1, 0, e / 2));
  at::Tensor x =
      dropout(at::embedding(emb, inputs) * std::sqrt(static_cast<double>(e)) + pe, cfg.dropout, training, gen);
  const at::Tensor causal = at::full({t, t}, -std::numeric_limits<float>::infinity(), at::kFloat).triu(1);

  at::Tensor mem = x;
  for (std::int64_t i = 0; i < cfg.nlayers; ++i) {  // post-norm encoder layers
    Attention sa(c);
    const at::Tensor &w1 = c.take(), &b1 = c.take(), &w2 = c.take(), &b2 = c.take();
    mem = layer_norm(c, mem + dropout(attention(cfg, sa, mem, mem, causal, training, gen), cfg.dropout, training, gen),
                     e);
    mem = layer_norm(
        c, mem + dropout(feed_forward(cfg, w1, b1, w2, b2, mem, training, gen), cfg.dropout, training, gen), e);
  }
  mem = layer_norm(c, mem, e);
  at::Tensor y = x;  // the decoder reads the inputs, not the targets (see header)
  for (std::int64_t i = 0; i < cfg.nlayers; ++i) {
    Attention sa(c);
    Attention ca(c);
    const at::Tensor &w1 = c.take(), &b1 = c.take(), &w2 = c.take(), &b2 = c.take();
    y = layer_norm(c, y + dropout(attention(cfg, sa, y, y, causal, training, gen), cfg.dropout, training, gen), e);
    y = layer_norm(c, y + dropout(attention(cfg, ca, y, mem, causal, training, gen), cfg.dropout, training, gen), e);
    y = layer_norm(c, y + dropout(feed_forward(cfg, w1, b1, w2, b2, y, training, gen), cfg.dropout, training, gen), e);
  }
  y = layer_norm(c, y, e);
  const at::Tensor &dw = c.take(), &db = c.take();
  at::Tensor logp = at::log_softmax(at::linear(y, dw, db), -1);
  return at::nll_loss(logp.reshape({-1, cfg.vocab_size}), targets.reshape({-1}), {}, at::Reduction::Sum);
}

}  // namespace shardpoint::train
