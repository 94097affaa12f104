#include "engine/checksum_sidecar.h"

#include <nlohmann/json.hpp>

#include "engine/block_checksum.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

namespace {

constexpr const char* kFormatName = "shardpoint-checksums";
constexpr int kVersion = 1;

}  // namespace

void ChecksumSidecar::add(ItemChecksums item) {
  auto key = std::make_pair(item.file, item.offset);
  items_[std::move(key)] = std::move(item);
}

const ItemChecksums* ChecksumSidecar::find(const std::string& file, std::uint64_t offset) const {
  auto it = items_.find(std::make_pair(file, offset));
  return it == items_.end() ? nullptr : &it->second;
}

std::string ChecksumSidecar::encode() const {
  nlohmann::ordered_json root;
  root["format"] = kFormatName;
  root["version"] = kVersion;
  root["algorithm"] = std::string(checksum_algorithm_name(algorithm_));
  root["block_size"] = block_size_;
  nlohmann::ordered_json items = nlohmann::ordered_json::array();
  for (const auto& [key, item] : items_) {
    nlohmann::ordered_json j;
    j["file"] = item.file;
    j["offset"] = item.offset;
    j["length"] = item.length;
    j["fqn"] = item.fqn;
    if (item.chunk_offsets) j["chunk_offsets"] = *item.chunk_offsets;
    j["checksum"] = checksum_to_hex(algorithm_, item.checksum);
    nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
    for (std::uint64_t b : item.blocks) blocks.push_back(checksum_to_hex(algorithm_, b));
    j["blocks"] = std::move(blocks);
    items.push_back(std::move(j));
  }
  root["items"] = std::move(items);
  return root.dump(1) + "\n";
}

namespace {

// nlohmann converts a float to an integer type with a cast, undefined for values out of
// range: integer fields must be JSON integers (found by the sidecar fuzzer).
std::uint64_t unsigned_at(const nlohmann::json& j, const char* key, const std::string& src) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_unsigned()) throw FormatError(src + ": \"" + key + "\": expected a non-negative integer");
  return v.get<std::uint64_t>();
}

format::Shape shape_at(const nlohmann::json& j, const char* key, const std::string& src) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_array()) throw FormatError(src + ": \"" + key + "\": expected an array of integers");
  format::Shape out;
  out.reserve(v.size());
  for (const nlohmann::json& e : v) {
    if (!e.is_number_integer()) throw FormatError(src + ": \"" + key + "\": expected an array of integers");
    out.push_back(e.get<std::int64_t>());
  }
  return out;
}

}  // namespace

ChecksumSidecar ChecksumSidecar::decode(std::string_view json, std::string_view source_name) {
  const std::string src(source_name);
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(src + ": not valid JSON: " + e.what());
  }
  try {
    if (!root.is_object() || root.value("format", std::string()) != kFormatName) {
      throw FormatError(src + ": expected \"format\": \"" + kFormatName + "\"");
    }
    const std::uint64_t version = unsigned_at(root, "version", src);
    if (version != static_cast<std::uint64_t>(kVersion)) {
      throw FormatError(src + ": unsupported version " + std::to_string(version) + " (this build reads version " +
                        std::to_string(kVersion) + ")");
    }
    ChecksumSidecar sidecar(checksum_algorithm_from_name(root.at("algorithm").get<std::string>(), src),
                            unsigned_at(root, "block_size", src));
    if (sidecar.block_size_ == 0) throw FormatError(src + ": block_size 0");
    for (const auto& j : root.at("items")) {
      ItemChecksums item;
      item.file = j.at("file").get<std::string>();
      item.offset = unsigned_at(j, "offset", src);
      item.length = unsigned_at(j, "length", src);
      item.fqn = j.value("fqn", std::string());
      if (j.contains("chunk_offsets")) item.chunk_offsets = shape_at(j, "chunk_offsets", src);
      // Built only for a message: every rank of a load decodes the whole sidecar, so the
      // per-item path stays free of string building.
      auto what = [&](std::string_view suffix) {
        return src + ": item \"" + item.fqn + "\" (" + item.file + " at " + std::to_string(item.offset) + ")" +
               std::string(suffix);
      };
      auto hex_value = [&](const nlohmann::json& value, std::string_view field) {
        const std::string& text = value.get_ref<const std::string&>();
        std::optional<std::uint64_t> parsed = parse_checksum_hex(sidecar.algorithm_, text);
        if (!parsed) checksum_from_hex(sidecar.algorithm_, text, what(field));  // throws, naming the item
        return *parsed;
      };
      item.checksum = hex_value(j.at("checksum"), " checksum");
      const auto& blocks = j.at("blocks");
      item.blocks.reserve(blocks.size());
      for (const auto& b : blocks) item.blocks.push_back(hex_value(b, " block"));
      const std::uint64_t expected_blocks = (item.length + sidecar.block_size_ - 1) / sidecar.block_size_;
      if (sidecar.algorithm_ != ChecksumAlgorithm::kNone && item.blocks.size() != expected_blocks) {
        throw FormatError(what(": expected " + std::to_string(expected_blocks) + " block checksums for " +
                               std::to_string(item.length) + " bytes, found " + std::to_string(item.blocks.size())));
      }
      sidecar.add(std::move(item));
    }
    return sidecar;
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(src + ": " + e.what());
  }
}

}  // namespace shardpoint::engine
