#include "engine/metadata_files.h"

#include <map>
#include <utility>

#include "engine/chunking.h"
#include "format/metadata_codec.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {
namespace {

// More digits than any world size: a longer number is not a rank PyTorch wrote.
constexpr std::size_t kMaxRankDigits = 7;

// The rank in "__<rank><suffix_start>...", where the digits end at `end_char`.
std::optional<int> leading_rank(std::string_view key, char end_char) {
  if (!key.starts_with("__")) return std::nullopt;
  std::size_t i = 2;
  int rank = 0;
  while (i < key.size() && key[i] >= '0' && key[i] <= '9' && i - 2 < kMaxRankDigits) {
    rank = rank * 10 + (key[i] - '0');
    ++i;
  }
  if (i == 2 || i >= key.size() || key[i] != end_char) return std::nullopt;
  return rank;
}

// "__<rank>.metadata" -> rank.
std::optional<int> rank_of_metadata_file(std::string_view key) {
  std::optional<int> rank = leading_rank(key, '.');
  if (!rank || key.substr(key.find('.')) != ".metadata") return std::nullopt;
  return rank;
}

// "__<rank>_<i>.distcp" -> rank.
std::optional<int> rank_of_data_file(std::string_view key) {
  if (!key.ends_with(".distcp") || key.find('/') != std::string_view::npos) return std::nullopt;
  return leading_rank(key, '_');
}

std::string rank_metadata_key(int rank) { return "__" + std::to_string(rank) + ".metadata"; }

void merge_tensor(format::TensorStorageMetadata& into, const format::TensorStorageMetadata& from,
                  const std::string& fqn, const std::string& name, const std::string& first_name) {
  if (from.properties.dtype != into.properties.dtype || from.size != into.size) {
    throw FormatError(name + ": tensor \"" + fqn + "\" is " + std::string(dtype_name(from.properties.dtype)) + " " +
                      shape_to_string(from.size) + ", " + first_name + " says " +
                      std::string(dtype_name(into.properties.dtype)) + " " + shape_to_string(into.size));
  }
  for (const format::ChunkStorageMetadata& chunk : from.chunks) {
    bool known = false;
    for (const format::ChunkStorageMetadata& have : into.chunks) {
      if (have.offsets != chunk.offsets) continue;
      if (have.sizes != chunk.sizes) {
        std::string message = name;
        message += ": tensor \"" + fqn + "\" chunk " + format::describe_chunk(chunk);
        message += " differs from " + first_name + "'s chunk " + format::describe_chunk(have) + " at the same offsets";
        throw FormatError(message);
      }
      known = true;
    }
    if (!known) into.chunks.push_back(chunk);
  }
}

}  // namespace

format::Metadata merge_rank_metadata(const std::vector<format::Metadata>& ranks,
                                     const std::vector<std::string>& names) {
  format::Metadata out;
  std::map<std::string, std::size_t> first_rank;  // fqn -> rank that brought it
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const format::Metadata& md = ranks[r];
    std::vector<std::string> order = md.key_order;
    if (order.empty()) {
      for (const auto& entry : md.state_dict_metadata) order.push_back(entry.first);
    }
    for (const std::string& fqn : order) {
      const auto found = md.state_dict_metadata.find(fqn);
      if (found == md.state_dict_metadata.end()) continue;
      auto [it, inserted] = out.state_dict_metadata.try_emplace(fqn, found->second);
      if (inserted) {
        out.key_order.push_back(fqn);
        first_rank.emplace(fqn, r);
        continue;
      }
      const std::string& first_name = names[first_rank.at(fqn)];
      auto* into = std::get_if<format::TensorStorageMetadata>(&it->second);
      const auto* from = std::get_if<format::TensorStorageMetadata>(&found->second);
      if ((into == nullptr) != (from == nullptr)) {
        std::string message = names[r];
        message += ": \"" + fqn + "\" is " + (from ? "a tensor" : "an object");
        message += ", " + first_name + " says " + (into ? "a tensor" : "an object");
        throw FormatError(message);
      }
      if (into != nullptr) merge_tensor(*into, *from, fqn, names[r], first_name);
    }
    for (const auto& [key, info] : md.storage_data) out.storage_data.try_emplace(key, info);
    for (const auto& [fqn, path] : md.planner_data) out.planner_data.try_emplace(fqn, path);
    if (r == 0) {
      out.version = md.version;
      out.storage_meta = md.storage_meta;
    }
  }
  return out;
}

std::optional<std::string> try_read_checkpoint_metadata(storage::Storage& st) {
  if (std::optional<std::string> bytes = st.try_read_all(kMetadataKey)) return bytes;
  std::map<int, std::string> metadata_files;
  int highest = -1;
  std::string highest_file;
  for (const storage::ObjectInfo& object : st.list("__")) {
    std::optional<int> rank = rank_of_metadata_file(object.key);
    if (rank) metadata_files.emplace(*rank, object.key);
    if (!rank) rank = rank_of_data_file(object.key);
    if (rank && *rank > highest) {
      highest = *rank;
      highest_file = object.key;
    }
  }
  if (metadata_files.empty()) return std::nullopt;
  std::vector<format::Metadata> ranks;
  std::vector<std::string> names;
  for (int r = 0; r <= highest; ++r) {
    const std::string key = rank_metadata_key(r);
    auto it = metadata_files.find(r);
    std::optional<std::string> bytes = it != metadata_files.end() ? st.try_read_all(key) : std::nullopt;
    if (!bytes) {
      throw FormatError(st.describe_key(key) + ": missing: the checkpoint was saved per rank (use_collectives=False, " +
                        std::to_string(metadata_files.size()) + " __<rank>.metadata files) and " + highest_file +
                        " shows at least " + std::to_string(highest + 1) + " ranks; rank " + std::to_string(r) +
                        "'s items cannot be found without it");
    }
    names.push_back(st.describe_key(key));
    ranks.push_back(format::decode_metadata(as_bytes(*bytes), names.back()));
  }
  return format::encode_metadata(merge_rank_metadata(ranks, names));
}

std::string read_checkpoint_metadata(storage::Storage& st) {
  std::optional<std::string> bytes = try_read_checkpoint_metadata(st);
  if (!bytes) {
    throw StorageError(StorageError::Kind::kNotFound,
                       st.describe_key(kMetadataKey) + ": not a committed checkpoint (no .metadata)");
  }
  return std::move(*bytes);
}

bool has_checkpoint_metadata(storage::Storage& st) {
  if (st.try_stat(kMetadataKey).has_value() || st.try_stat(rank_metadata_key(0)).has_value()) return true;
  // Rank 0's file lost: still a per-rank checkpoint, so that reading it names what is missing.
  for (const storage::ObjectInfo& object : st.list("__")) {
    if (rank_of_metadata_file(object.key)) return true;
  }
  return false;
}

}  // namespace shardpoint::engine
