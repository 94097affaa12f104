#include "format/safetensors_writer.h"

#include <set>

#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      static const char* kHex = "0123456789abcdef";
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

}  // namespace

std::uint64_t SafetensorsEntry::nbytes() const {
  std::uint64_t n = dtype_itemsize(dtype);
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::optional<std::string_view> safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return "F64";
    case DType::kFloat32: return "F32";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kInt64: return "I64";
    case DType::kInt32: return "I32";
    case DType::kInt16: return "I16";
    case DType::kInt8: return "I8";
    case DType::kUInt8: return "U8";
    case DType::kUInt16: return "U16";
    case DType::kUInt32: return "U32";
    case DType::kUInt64: return "U64";
    case DType::kBool: return "BOOL";
    case DType::kFloat8_e4m3fn: return "F8_E4M3";
    case DType::kFloat8_e5m2: return "F8_E5M2";
    default: return std::nullopt;
  }
}

std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  std::string out = "{";
  bool first = true;
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (!first) out += ',';
      first = false;
      append_json_string(out, k);
      out += ':';
      append_json_string(out, v);
    }
    out += '}';
    first = false;
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& e : entries) {
    auto dt = safetensors_dtype(e.dtype);
    if (!dt) {
      throw UsageError("safetensors: tensor \"" + e.name + "\": dtype " + std::string(dtype_name(e.dtype)) +
                       " has no safetensors name");
    }
    if (e.name == "__metadata__" || !names.insert(e.name).second) {
      throw UsageError("safetensors: duplicate or reserved tensor name \"" + e.name + "\"");
    }
    if (!first) out += ',';
    first = false;
    append_json_string(out, e.name);
    out += ":{\"dtype\":\"";
    out += *dt;
    out += "\",\"shape\":[";
    for (std::size_t i = 0; i < e.shape.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(e.shape[i]);
    }
    std::uint64_t end = offset + e.nbytes();
    out += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  out += '}';
  return out;
}

SafetensorsWriter::SafetensorsWriter(ByteSink& sink, std::vector<SafetensorsEntry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : sink_(sink), entries_(std::move(entries)) {
  std::string header = safetensors_header(entries_, metadata);
  while ((8 + header.size()) % 8 != 0) header += ' ';
  for (const auto& e : entries_) total_ += e.nbytes();
  std::byte len[8];
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  sink_.write(ByteSpan(len, 8));
  sink_.write(std::string_view(header));
}

void SafetensorsWriter::write(ByteSpan data) {
  if (written_ + data.size() > total_) {
    throw UsageError("safetensors: " + std::to_string(written_ + data.size()) +
                     " data bytes written, header declares " + std::to_string(total_));
  }
  sink_.write(data);
  written_ += data.size();
}

void SafetensorsWriter::finish() {
  if (written_ != total_) {
    throw UsageError("safetensors: " + std::to_string(written_) + " data bytes written, header declares " +
                     std::to_string(total_));
  }
}

}  // namespace shardpoint::format
