#include "format/safetensors_index.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace shardpoint::format {

std::vector<std::vector<std::size_t>> group_into_shards(const std::vector<std::uint64_t>& sizes,
                                                        std::uint64_t max_shard_bytes) {
  std::vector<std::vector<std::size_t>> files(1);
  std::uint64_t in_file = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (max_shard_bytes > 0 && in_file > 0 && in_file + sizes[i] > max_shard_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(i);
    in_file += sizes[i];
  }
  return files;
}

std::string safetensors_shard_name(std::size_t index, std::size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

std::string safetensors_index_json(std::uint64_t total_size, const std::map<std::string, std::string>& weight_map) {
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (const auto& [k, v] : weight_map) map[k] = v;
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = map;
  return index.dump(2) + "\n";
}

}  // namespace shardpoint::format
