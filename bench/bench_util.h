// Small helpers shared by the benchmark programs: wall clock, peak-RSS reset and reading,
// and the GPT-2-shaped state of the DCP benchmark (described in bench/dcp_bench.py).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace shardpoint::bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// VmHWM / VmRSS of this process in bytes.
inline std::uint64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

// Resets VmHWM to the current RSS, so the next VmHWM reading is the peak of what follows.
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
};

// The parameters of the peer baseline's model: GPT-2 style, `layers` layers, d=768,
// ff=3072, vocab 8192, ctx 1024, LayerNorm weights and biases (24 layers: 177,188,352
// float32 parameters).
inline std::vector<TensorSpec> gpt2_parameters(int layers) {
  const std::int64_t d = 768, ff = 3072, vocab = 8192, ctx = 1024;
  std::vector<TensorSpec> specs = {{"wte.weight", {vocab, d}}, {"wpe.weight", {ctx, d}}};
  for (int l = 0; l < layers; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    for (auto [n, s] :
         std::vector<std::pair<std::string, std::vector<std::int64_t>>>{{"ln_1.weight", {d}},
                                                                        {"ln_1.bias", {d}},
                                                                        {"attn.c_attn.weight", {3 * d, d}},
                                                                        {"attn.c_attn.bias", {3 * d}},
                                                                        {"attn.c_proj.weight", {d, d}},
                                                                        {"attn.c_proj.bias", {d}},
                                                                        {"ln_2.weight", {d}},
                                                                        {"ln_2.bias", {d}},
                                                                        {"mlp.c_fc.weight", {ff, d}},
                                                                        {"mlp.c_fc.bias", {ff}},
                                                                        {"mlp.c_proj.weight", {d, ff}},
                                                                        {"mlp.c_proj.bias", {d}}}) {
      specs.push_back({p + n, s});
    }
  }
  specs.push_back({"ln_f.weight", {d}});
  specs.push_back({"ln_f.bias", {d}});
  return specs;
}

inline std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

}  // namespace shardpoint::bench
