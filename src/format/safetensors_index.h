// The sharded safetensors layout Hugging Face uses for large models: the weights split
// into files "model-00001-of-0000N.safetensors" ... (each a safetensors file, see
// safetensors_writer.h) plus "model.safetensors.index.json":
//   {
//     "metadata": {"total_size": <data bytes of all tensors>},
//     "weight_map": {"<tensor name>": "<file name>", ...}   (sorted by tensor name)
//   }
// written with 2-space indentation and a final newline, as transformers'
// save_pretrained writes it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardpoint::format {

inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

// Groups tensors of these data sizes, in order, into files of at most max_shard_bytes
// each: a file is closed when the next tensor would overflow it, so a tensor larger than
// the limit gets a file of its own. max_shard_bytes 0: everything in one file. Returns the
// tensor indexes of each file; at least one file (empty when there are no tensors).
std::vector<std::vector<std::size_t>> group_into_shards(const std::vector<std::uint64_t>& sizes,
                                                        std::uint64_t max_shard_bytes);

// "model-%05zu-of-%05zu.safetensors" for file `index` (0-based) of `count`.
std::string safetensors_shard_name(std::size_t index, std::size_t count);

// The index file's text. weight_map: tensor name -> file name.
std::string safetensors_index_json(std::uint64_t total_size, const std::map<std::string, std::string>& weight_map);

}  // namespace shardpoint::format
