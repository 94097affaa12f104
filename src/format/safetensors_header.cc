#include "format/safetensors_header.h"

#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

#include "core/byte_io.h"
#include "format/safetensors_writer.h"
#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

using Json = nlohmann::ordered_json;

// Deepest nesting a valid header has: root object > tensor entry > shape array. Deeper
// input is refused while parsing, before it can cost memory.
constexpr int kMaxJsonDepth = 3;

std::string in_quotes(std::string_view s) { return "\"" + std::string(s) + "\""; }

std::string shape_text(const Shape& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

Json parse_json(std::string_view text, const std::string& what) {
  try {
    return Json::parse(text, [&](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth) {
        throw FormatError(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      }
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(what + ": not valid JSON: " + e.what());
  }
}

// A non-negative integer that fits in int64.
std::optional<std::uint64_t> as_count(const Json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
  return std::nullopt;
}

SafetensorsTensor parse_entry(const std::string& name, const Json& entry, std::uint64_t data_bytes,
                              const std::string& where) {
  const std::string at = where + ": tensor " + in_quotes(name);
  if (!entry.is_object()) throw FormatError(at + ": expected an object, found " + entry.type_name());
  SafetensorsTensor t;
  t.name = name;
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) throw FormatError(at + ": expected a \"dtype\" string");
  const std::optional<DType> parsed = dtype_from_safetensors(dtype->get_ref<const std::string&>());
  if (!parsed) throw FormatError(at + ": unknown dtype " + in_quotes(dtype->get_ref<const std::string&>()));
  t.dtype = *parsed;
  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) throw FormatError(at + ": expected a \"shape\" array");
  std::uint64_t bytes = dtype_itemsize(t.dtype);
  bool overflow = false;
  for (const Json& d : *shape) {
    const std::optional<std::uint64_t> n = as_count(d);
    if (!n || *n > static_cast<std::uint64_t>(INT64_MAX)) {
      throw FormatError(at + ": shape " + shape->dump() + ": expected non-negative integers");
    }
    t.shape.push_back(static_cast<std::int64_t>(*n));
    overflow |= __builtin_mul_overflow(bytes, *n, &bytes);
  }
  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !as_count((*offsets)[0]) ||
      !as_count((*offsets)[1])) {
    throw FormatError(at + ": expected \"data_offsets\" [begin, end] of non-negative integers");
  }
  t.begin = *as_count((*offsets)[0]);
  t.end = *as_count((*offsets)[1]);
  if (t.begin > t.end || t.end > data_bytes) {
    throw FormatError(at + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                      "] outside the data (" + std::to_string(data_bytes) + " bytes)");
  }
  if (overflow || bytes != t.end - t.begin) {
    throw FormatError(at + ": " + std::string(dtype_name(t.dtype)) + " " + shape_text(t.shape) + " needs " +
                      (overflow ? std::string("more than 2^64") : std::to_string(bytes)) +
                      " bytes, data_offsets hold " + std::to_string(t.end - t.begin));
  }
  return t;
}

}  // namespace

const SafetensorsTensor* SafetensorsHeader::find(std::string_view name) const {
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : &tensors[it->second];
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (safetensors_dtype(d) == name) return d;
  }
  return std::nullopt;
}

SafetensorsHeader parse_safetensors_header(std::string_view json, std::uint64_t data_bytes, std::string_view file) {
  const std::string where(file);
  const std::string what = where + ": safetensors header";
  if (json.empty() || json.front() != '{') throw FormatError(what + ": expected a JSON object starting with '{'");
  const Json root = parse_json(json, what);
  if (!root.is_object()) throw FormatError(what + ": expected a JSON object, found " + root.type_name());
  SafetensorsHeader header;
  header.header_bytes = json.size();
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) throw FormatError(what + ": __metadata__: expected an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) throw FormatError(what + ": __metadata__ " + in_quotes(k) + ": expected a string");
        header.metadata.emplace(k, v.get<std::string>());
      }
      continue;
    }
    header.by_name.emplace(key, header.tensors.size());
    header.tensors.push_back(parse_entry(key, value, data_bytes, where));
  }
  // No two tensors share a byte.
  std::vector<const SafetensorsTensor*> by_begin;
  for (const SafetensorsTensor& t : header.tensors) {
    if (t.end > t.begin) by_begin.push_back(&t);
  }
  std::sort(by_begin.begin(), by_begin.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_begin.size(); ++i) {
    if (by_begin[i]->begin < by_begin[i - 1]->end) {
      throw FormatError(where + ": tensor " + in_quotes(by_begin[i]->name) + ": data_offsets [" +
                        std::to_string(by_begin[i]->begin) + ", " + std::to_string(by_begin[i]->end) +
                        "] overlap tensor " + in_quotes(by_begin[i - 1]->name) + " [" +
                        std::to_string(by_begin[i - 1]->begin) + ", " + std::to_string(by_begin[i - 1]->end) + "]");
    }
  }
  return header;
}

SafetensorsHeader read_safetensors_header(const ByteSource& source, std::uint64_t offset, std::string_view file) {
  const std::string where(file);
  const std::uint64_t size = source.size();
  if (offset > size || size - offset < 8) {
    throw FormatError(where + ": safetensors header: expected an 8-byte length at offset " + std::to_string(offset) +
                      ", found " + std::to_string(offset > size ? 0 : size - offset) + " bytes");
  }
  std::array<std::byte, 8> prefix{};
  source.read(offset, prefix, "safetensors header length");
  const std::uint64_t n = get_le<std::uint64_t>(prefix.data());
  const std::uint64_t room = size - offset - 8;
  if (n > room || n > kMaxSafetensorsHeaderBytes) {
    throw FormatError(where + ": safetensors header length " + std::to_string(n) + " at offset " +
                      std::to_string(offset) + " reaches past the end of the file (" + std::to_string(room) +
                      " bytes follow)" + (n > kMaxSafetensorsHeaderBytes ? " or the 100 MB limit" : ""));
  }
  const std::string json = source.read_string(offset + 8, n, "safetensors header");
  return parse_safetensors_header(json, room - n, file);
}

std::map<std::string, Shape> dcp_sharding_info(const SafetensorsHeader& header, std::string_view file) {
  std::map<std::string, Shape> out;
  auto it = header.metadata.find(std::string(kDcpShardingInfoKey));
  if (it == header.metadata.end()) return out;
  const std::string what = std::string(file) + ": __metadata__ " + in_quotes(kDcpShardingInfoKey);
  const Json info = parse_json(it->second, what);
  if (!info.is_object()) throw FormatError(what + ": expected a JSON object");
  for (const auto& [fqn, entry] : info.items()) {
    const SafetensorsTensor* t = header.find(fqn);
    if (t == nullptr) throw FormatError(what + ": names tensor " + in_quotes(fqn) + ", which the header lacks");
    const auto saved = entry.is_object() ? entry.find("saved_offsets") : entry.end();
    if (saved == entry.end() || !saved->is_array() || saved->size() != t->shape.size()) {
      throw FormatError(what + ": tensor " + in_quotes(fqn) + ": expected \"saved_offsets\" with " +
                        std::to_string(t->shape.size()) + " entries");
    }
    Shape offsets;
    for (const Json& o : *saved) {
      const std::optional<std::uint64_t> n = as_count(o);
      if (!n || *n > static_cast<std::uint64_t>(INT64_MAX / 2)) {
        throw FormatError(what + ": tensor " + in_quotes(fqn) + ": saved_offsets " + saved->dump() +
                          ": expected non-negative integers");
      }
      offsets.push_back(static_cast<std::int64_t>(*n));
    }
    out.emplace(fqn, std::move(offsets));
  }
  return out;
}

}  // namespace shardpoint::format
