#include "engine/plan_codec.h"

#include <nlohmann/json.hpp>

#include "core/byte_io.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

namespace {

using nlohmann::json;

json path_to_json(const format::ObjectPath& path) {
  json out = json::array();
  for (const auto& element : path) {
    if (const auto* s = std::get_if<std::string>(&element)) {
      out.push_back(*s);
    } else {
      out.push_back(std::get<std::int64_t>(element));
    }
  }
  return out;
}

format::ObjectPath path_from_json(const json& j) {
  format::ObjectPath path;
  for (const auto& e : j) {
    if (e.is_string()) {
      path.emplace_back(e.get<std::string>());
    } else {
      path.emplace_back(e.get<std::int64_t>());
    }
  }
  return path;
}

json index_to_json(const format::MetadataIndex& index) {
  json j;
  j["fqn"] = index.fqn;
  j["offset"] = index.offset ? json(*index.offset) : json(nullptr);
  j["index"] = index.index ? json(*index.index) : json(nullptr);
  return j;
}

format::MetadataIndex index_from_json(const json& j) {
  format::MetadataIndex index;
  index.fqn = j.at("fqn").get<std::string>();
  if (!j.at("offset").is_null()) index.offset = j.at("offset").get<format::Shape>();
  if (!j.at("index").is_null()) index.index = j.at("index").get<std::int64_t>();
  return index;
}

DType dtype_from_json(const json& j) {
  const std::string name = j.get<std::string>();
  auto dtype = dtype_from_name(name);
  if (!dtype) throw FormatError("unknown dtype \"" + name + "\"");
  return *dtype;
}

template <typename Fn>
auto decode_json(std::string_view bytes, std::string_view what, Fn&& fn) {
  try {
    return fn(json::parse(bytes));
  } catch (const json::exception& e) {
    throw FormatError(std::string(what) + ": " + e.what());
  } catch (const FormatError& e) {
    throw FormatError(std::string(what) + ": " + e.what());
  }
}

}  // namespace

std::string encode_save_plan(const SavePlan& plan) {
  json j;
  j["rank"] = plan.rank;
  json items = json::array();
  for (const WriteItem& item : plan.items) {
    json w;
    w["index"] = index_to_json(item.index);
    w["type"] = item.type == WriteItemType::kTensor ? "tensor" : "bytes";
    w["dtype"] = std::string(dtype_name(item.dtype));
    w["requires_grad"] = item.requires_grad;
    w["global_size"] = item.global_size;
    w["chunk_offsets"] = item.chunk.offsets;
    w["chunk_sizes"] = item.chunk.sizes;
    w["nbytes"] = item.nbytes;
    w["bytes_size"] = item.bytes_size ? json(*item.bytes_size) : json(nullptr);
    w["file"] = item.file;
    w["index_in_file"] = item.index_in_file;
    items.push_back(std::move(w));
  }
  j["items"] = std::move(items);
  json pd = json::object();
  for (const auto& [fqn, path] : plan.planner_data) pd[fqn] = path_to_json(path);
  j["planner_data"] = std::move(pd);
  j["files"] = plan.files;
  return j.dump();
}

SavePlan decode_save_plan(std::string_view bytes, std::string_view what) {
  return decode_json(bytes, what, [](const json& j) {
    SavePlan plan;
    plan.rank = j.at("rank").get<int>();
    for (const json& w : j.at("items")) {
      WriteItem item;
      item.index = index_from_json(w.at("index"));
      item.type = w.at("type").get<std::string>() == "tensor" ? WriteItemType::kTensor : WriteItemType::kBytes;
      item.dtype = dtype_from_json(w.at("dtype"));
      item.requires_grad = w.at("requires_grad").get<bool>();
      item.global_size = w.at("global_size").get<format::Shape>();
      item.chunk.offsets = w.at("chunk_offsets").get<format::Shape>();
      item.chunk.sizes = w.at("chunk_sizes").get<format::Shape>();
      item.nbytes = w.at("nbytes").get<std::uint64_t>();
      if (!w.at("bytes_size").is_null()) item.bytes_size = w.at("bytes_size").get<std::uint64_t>();
      item.file = w.at("file").get<std::string>();
      item.index_in_file = w.at("index_in_file").get<std::int64_t>();
      plan.items.push_back(std::move(item));
    }
    for (const auto& [fqn, path] : j.at("planner_data").items()) plan.planner_data[fqn] = path_from_json(path);
    plan.files = j.at("files").get<std::vector<std::string>>();
    return plan;
  });
}

std::string encode_written_items(const std::vector<WrittenItem>& items) {
  json out = json::array();
  for (const WrittenItem& item : items) {
    json w;
    w["index"] = index_to_json(item.index);
    w["file"] = item.info.relative_path;
    w["offset"] = item.info.offset;
    w["length"] = item.info.length;
    if (!item.info.transform_descriptors.empty()) w["transform_descriptors"] = item.info.transform_descriptors;
    w["checksum"] = item.checksum;
    w["blocks"] = item.blocks;
    if (item.data_offset) w["data_offset"] = *item.data_offset;
    out.push_back(std::move(w));
  }
  return out.dump();
}

std::vector<WrittenItem> decode_written_items(std::string_view bytes, std::string_view what) {
  return decode_json(bytes, what, [](const json& j) {
    std::vector<WrittenItem> items;
    for (const json& w : j) {
      WrittenItem item;
      item.index = index_from_json(w.at("index"));
      item.info.relative_path = w.at("file").get<std::string>();
      item.info.offset = w.at("offset").get<std::uint64_t>();
      item.info.length = w.at("length").get<std::uint64_t>();
      if (w.contains("transform_descriptors")) {
        item.info.transform_descriptors = w.at("transform_descriptors").get<std::vector<std::string>>();
      }
      item.checksum = w.at("checksum").get<std::uint64_t>();
      item.blocks = w.at("blocks").get<std::vector<std::uint64_t>>();
      if (w.contains("data_offset")) item.data_offset = w.at("data_offset").get<std::uint64_t>();
      items.push_back(std::move(item));
    }
    return items;
  });
}

std::string encode_rank_message(RankStatus status, std::string_view body) {
  std::string out;
  out.reserve(1 + body.size());
  out.push_back(static_cast<char>(status));
  out.append(body);
  return out;
}

RankMessage decode_rank_message(std::string_view message) {
  if (message.empty()) return {};
  RankMessage m;
  m.body = message.substr(1);
  switch (static_cast<RankStatus>(message[0])) {
    case RankStatus::kPlan:
    case RankStatus::kWriteResult:
    case RankStatus::kMetadata:
    case RankStatus::kError: m.status = static_cast<RankStatus>(message[0]); break;
  }
  return m;
}

std::string pack_parts(const std::vector<std::string>& parts) {
  std::string out;
  std::size_t total = 0;
  for (const auto& p : parts) total += 8 + p.size();
  out.reserve(total);
  for (const auto& p : parts) {
    put_le<std::uint64_t>(out, p.size());
    out += p;
  }
  return out;
}

std::vector<std::string> unpack_parts(std::string_view bytes, std::string_view what) {
  std::vector<std::string> parts;
  ByteCursor cursor(as_bytes(bytes));
  while (!cursor.at_end()) {
    const auto n = cursor.read_le<std::uint64_t>(what);
    ByteSpan part = cursor.read_bytes(n, what);
    parts.emplace_back(as_chars(part));
  }
  return parts;
}

}  // namespace shardpoint::engine
