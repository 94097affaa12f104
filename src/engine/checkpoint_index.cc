#include "engine/checkpoint_index.h"

#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/checksum.h"
#include "engine/block_checksum.h"
#include "shardpoint/error.h"

namespace shardpoint::engine {

namespace {

constexpr char kMagic[8] = {'S', 'P', 'I', 'N', 'D', 'E', 'X', '\0'};
// Version 2 added the tensors' strides; version 1 indexes (no strides) still decode.
constexpr std::uint32_t kVersion = 2;
constexpr std::uint32_t kOldestVersion = 1;
// magic, version, .metadata length and CRC-32C
constexpr std::size_t kHeaderBytes = sizeof kMagic + 4 + 8 + 4;
constexpr std::size_t kTrailerBytes = 4;

std::uint8_t algorithm_code(ChecksumAlgorithm a) {
  switch (a) {
    case ChecksumAlgorithm::kNone: return 0;
    case ChecksumAlgorithm::kCrc32c: return 1;
    case ChecksumAlgorithm::kXxh3: return 2;
  }
  return 0;
}

class Writer {
 public:
  std::string out;

  void u8(std::uint8_t v) { put_le<std::uint8_t>(out, v); }
  void u32(std::uint32_t v) { put_le<std::uint32_t>(out, v); }
  void u64(std::uint64_t v) { put_le<std::uint64_t>(out, v); }
  void i64(std::int64_t v) { put_le<std::uint64_t>(out, static_cast<std::uint64_t>(v)); }
  void count(std::size_t n) {
    if (n > std::numeric_limits<std::uint32_t>::max()) throw UsageError("checkpoint index: more than 2^32 entries");
    u32(static_cast<std::uint32_t>(n));
  }
  void str(std::string_view s) {
    count(s.size());
    out.append(s);
  }
  void shape(const format::Shape& s) {
    count(s.size());
    for (std::int64_t v : s) i64(v);
  }
  void opt_str(const std::optional<std::string>& s) {
    u8(s ? 1 : 0);
    if (s) str(*s);
  }
  void strings(const std::vector<std::string>& list) {
    count(list.size());
    for (const std::string& s : list) str(s);
  }
};

// Reads fields; `what` names the field in errors (messages get the source name from
// decode_checkpoint_index, so reading builds no strings).
class Reader {
 public:
  explicit Reader(std::string_view bytes) : cursor_(as_bytes(bytes)) {}

  std::uint8_t u8(const char* what) { return cursor_.read_le<std::uint8_t>(what); }
  std::uint32_t u32(const char* what) { return cursor_.read_le<std::uint32_t>(what); }
  std::uint64_t u64(const char* what) { return cursor_.read_le<std::uint64_t>(what); }
  std::int64_t i64(const char* what) { return static_cast<std::int64_t>(u64(what)); }
  bool flag(const char* what) {
    const std::uint8_t v = u8(what);
    if (v > 1) fail(what, "expected 0 or 1, found " + std::to_string(v));
    return v == 1;
  }
  // A count of entries that each take at least `min_bytes`: more than the bytes left
  // could hold is malformed (and is refused before anything is reserved for them).
  std::size_t count(const char* what, std::size_t min_bytes) {
    const std::uint32_t n = u32(what);
    if (static_cast<std::uint64_t>(n) * min_bytes > cursor_.remaining()) {
      fail(what,
           std::to_string(n) + " entries cannot fit in the " + std::to_string(cursor_.remaining()) + " bytes left");
    }
    return n;
  }
  std::string str(const char* what) {
    const std::size_t n = count(what, 1);
    return std::string(as_chars(cursor_.read_bytes(n, what)));
  }
  format::Shape shape(const char* what) {
    format::Shape s(count(what, 8));
    for (std::int64_t& v : s) v = i64(what);
    return s;
  }
  std::optional<std::string> opt_str(const char* what) {
    if (!flag(what)) return std::nullopt;
    return str(what);
  }
  std::vector<std::string> strings(const char* what) {
    std::vector<std::string> list(count(what, 4));
    for (std::string& s : list) s = str(what);
    return list;
  }
  bool at_end() const { return cursor_.at_end(); }
  // The index's format version (fields added after version 1 are read only when present).
  std::uint32_t version() const { return version_; }
  void set_version(std::uint32_t v) { version_ = v; }

  [[noreturn]] void fail(const char* what, const std::string& detail) const {
    throw FormatError(std::string(what) + " at offset " + std::to_string(cursor_.position()) + ": " + detail);
  }

 private:
  ByteCursor cursor_;
  std::uint32_t version_ = 1;
};

std::uint32_t stored_crc(std::string_view index) {
  return get_le<std::uint32_t>(reinterpret_cast<const std::byte*>(index.data() + index.size() - kTrailerBytes));
}

void encode_entry(Writer& w, const std::string& fqn, const format::StorageMetadata& entry) {
  w.str(fqn);
  const auto* tensor = std::get_if<format::TensorStorageMetadata>(&entry);
  w.u8(tensor ? 0 : 1);
  if (!tensor) return;
  w.str(dtype_name(tensor->properties.dtype));
  w.u8(tensor->properties.requires_grad ? 1 : 0);
  w.u8(tensor->properties.pin_memory ? 1 : 0);
  w.u32(static_cast<std::uint32_t>(tensor->properties.memory_format));
  w.u8(tensor->properties.strides ? 1 : 0);
  if (tensor->properties.strides) w.shape(*tensor->properties.strides);
  w.shape(tensor->size);
  w.count(tensor->chunks.size());
  for (const auto& chunk : tensor->chunks) {
    w.shape(chunk.offsets);
    w.shape(chunk.sizes);
  }
}

void decode_entry(Reader& r, format::Metadata& md) {
  std::string fqn = r.str("state_dict_metadata key");
  const std::uint8_t kind = r.u8("state_dict_metadata kind");
  format::StorageMetadata entry = format::BytesStorageMetadata{};
  if (kind == 0) {
    format::TensorStorageMetadata tensor;
    const std::string dtype = r.str("tensor dtype");
    const std::optional<DType> parsed = dtype_from_name(dtype);
    if (!parsed) r.fail("tensor dtype", "unknown dtype \"" + dtype + "\" of \"" + fqn + "\"");
    tensor.properties.dtype = *parsed;
    tensor.properties.requires_grad = r.flag("requires_grad");
    tensor.properties.pin_memory = r.flag("pin_memory");
    tensor.properties.memory_format = static_cast<std::int32_t>(r.u32("memory_format"));
    if (r.version() >= 2 && r.flag("tensor has strides")) tensor.properties.strides = r.shape("tensor strides");
    tensor.size = r.shape("tensor size");
    tensor.chunks.resize(r.count("chunks", 8));
    for (auto& chunk : tensor.chunks) {
      chunk.offsets = r.shape("chunk offsets");
      chunk.sizes = r.shape("chunk sizes");
    }
    entry = std::move(tensor);
  } else if (kind != 1) {
    r.fail("state_dict_metadata kind", "expected 0 (tensor) or 1 (object), found " + std::to_string(kind));
  }
  if (!md.state_dict_metadata.emplace(fqn, std::move(entry)).second) {
    r.fail("state_dict_metadata key", "\"" + fqn + "\" appears twice");
  }
  md.key_order.push_back(std::move(fqn));
}

void encode_planner_data(Writer& w, const std::map<std::string, format::ObjectPath>& planner_data) {
  w.count(planner_data.size());
  for (const auto& [fqn, path] : planner_data) {
    w.str(fqn);
    w.count(path.size());
    for (const format::PathElement& e : path) {
      if (const auto* s = std::get_if<std::string>(&e)) {
        w.u8(0);
        w.str(*s);
      } else {
        w.u8(1);
        w.i64(std::get<std::int64_t>(e));
      }
    }
  }
}

void encode_storage_item(Writer& w, const format::MetadataIndex& index, const format::StorageInfo& info,
                         std::optional<std::uint64_t> data_offset, const ItemChecksums* sums) {
  w.str(index.fqn);
  w.u8(index.offset ? 1 : 0);
  if (index.offset) w.shape(*index.offset);
  w.u8(index.index ? 1 : 0);
  if (index.index) w.i64(*index.index);
  w.str(info.relative_path);
  w.u64(info.offset);
  w.u64(info.length);
  w.strings(info.transform_descriptors);
  w.u8(data_offset ? 1 : 0);
  if (data_offset) w.u64(*data_offset);
  w.u8(sums ? 1 : 0);
  if (sums) {
    w.u64(sums->checksum);
    w.count(sums->blocks.size());
    for (std::uint64_t b : sums->blocks) w.u64(b);
  }
}

void encode_storage_meta(Writer& w, const std::optional<format::StorageMeta>& meta) {
  w.u8(meta ? 1 : 0);
  if (!meta) return;
  w.opt_str(meta->checkpoint_id);
  w.opt_str(meta->save_id);
  w.opt_str(meta->load_id);
  w.strings(meta->modules);
}

}  // namespace

std::string encode_checkpoint_index(const format::Metadata& metadata, ByteSpan metadata_bytes,
                                    const ChecksumSidecar* checksums,
                                    const std::map<format::MetadataIndex, std::uint64_t>& data_offsets) {
  if (metadata.planner_data_raw) throw UsageError("checkpoint index: metadata with a raw planner_data pickle");
  Writer w;
  w.out.append(kMagic, sizeof kMagic);
  w.u32(kVersion);
  w.u64(metadata_bytes.size());
  w.u32(crc32c(0, metadata_bytes));
  w.u8(algorithm_code(checksums ? checksums->algorithm() : ChecksumAlgorithm::kNone));
  w.u64(checksums ? checksums->block_size() : 0);

  // Key order as decode_metadata would report it for these bytes: the file's order when
  // the metadata was decoded, else the encoder's (the map's).
  w.count(metadata.state_dict_metadata.size());
  if (metadata.key_order.size() == metadata.state_dict_metadata.size()) {
    for (const std::string& fqn : metadata.key_order) encode_entry(w, fqn, metadata.state_dict_metadata.at(fqn));
  } else {
    for (const auto& [fqn, entry] : metadata.state_dict_metadata) encode_entry(w, fqn, entry);
  }
  encode_planner_data(w, metadata.planner_data);
  w.count(metadata.storage_data.size());
  for (const auto& [index, info] : metadata.storage_data) {
    auto data = data_offsets.find(index);
    encode_storage_item(w, index, info, data != data_offsets.end() ? std::optional(data->second) : std::nullopt,
                        checksums ? checksums->find(info.relative_path, info.offset) : nullptr);
  }
  encode_storage_meta(w, metadata.storage_meta);
  w.opt_str(metadata.version);
  w.u32(crc32c(0, as_bytes(w.out)));
  return std::move(w.out);
}

bool index_matches(std::string_view index, ByteSpan metadata_bytes) {
  if (index.size() < kHeaderBytes + kTrailerBytes) return false;
  if (std::memcmp(index.data(), kMagic, sizeof kMagic) != 0) return false;
  const auto* p = reinterpret_cast<const std::byte*>(index.data()) + sizeof kMagic;
  if (const std::uint32_t v = get_le<std::uint32_t>(p); v < kOldestVersion || v > kVersion) return false;
  if (get_le<std::uint64_t>(p + 4) != metadata_bytes.size()) return false;
  if (get_le<std::uint32_t>(p + 12) != crc32c(0, metadata_bytes)) return false;
  return stored_crc(index) == crc32c(0, as_bytes(index.substr(0, index.size() - kTrailerBytes)));
}

namespace {

void decode_planner_data(Reader& r, format::Metadata& md) {
  const std::size_t entries = r.count("planner_data entries", 8);
  for (std::size_t i = 0; i < entries; ++i) {
    std::string fqn = r.str("planner_data key");
    format::ObjectPath path(r.count("planner_data path", 5));
    for (format::PathElement& e : path) {
      const std::uint8_t tag = r.u8("planner_data element");
      if (tag == 0) {
        e = r.str("planner_data element");
      } else if (tag == 1) {
        e = r.i64("planner_data element");
      } else {
        r.fail("planner_data element", "expected 0 (str) or 1 (int), found " + std::to_string(tag));
      }
    }
    md.planner_data.insert_or_assign(std::move(fqn), std::move(path));
  }
}

// The checksums of the blob `info` holds (`checksums` is the index's, block size known).
ItemChecksums decode_item_checksums(Reader& r, const format::MetadataIndex& index, const format::StorageInfo& info,
                                    const std::optional<ChecksumSidecar>& checksums) {
  if (!checksums) r.fail("checksums", "an item has checksums but the index names no algorithm");
  if (checksums->find(info.relative_path, info.offset)) {
    r.fail("checksums",
           "two items have checksums for the blob at " + std::to_string(info.offset) + " of " + info.relative_path);
  }
  ItemChecksums sums{info.relative_path, info.offset, info.length, index.fqn, index.offset, 0, {}};
  sums.checksum = r.u64("item checksum");
  sums.blocks.resize(r.count("block checksums", 8));
  for (std::uint64_t& b : sums.blocks) b = r.u64("block checksum");
  const std::uint64_t block_size = checksums->block_size();
  const std::uint64_t expected = (info.length + block_size - 1) / block_size;
  if (sums.blocks.size() != expected) {
    r.fail("block checksums", "item \"" + index.fqn + "\" (" + info.relative_path + " at " +
                                  std::to_string(info.offset) + "): expected " + std::to_string(expected) +
                                  " block checksums for " + std::to_string(info.length) + " bytes, found " +
                                  std::to_string(sums.blocks.size()));
  }
  return sums;
}

// blobs_without_checksums: the (file, offset) of every item decoded so far that has none. The
// encoder writes a blob's checksums for every item naming that blob, so an index in which
// items naming one blob disagree is not one it wrote (and would not survive re-encoding).
void decode_storage_item(Reader& r, CheckpointIndex& out,
                         std::set<std::pair<std::string, std::uint64_t>>& blobs_without_checksums) {
  format::MetadataIndex index;
  index.fqn = r.str("storage item fqn");
  if (r.flag("storage item has chunk offset")) index.offset = r.shape("storage item chunk offset");
  if (r.flag("storage item has chunk position")) index.index = r.i64("storage item chunk position");
  format::StorageInfo info;
  info.relative_path = r.str("relative_path");
  info.offset = r.u64("blob offset");
  info.length = r.u64("blob length");
  info.transform_descriptors = r.strings("transform descriptors");
  if (r.flag("has data start")) out.data_offsets.emplace(index, r.u64("data start"));
  if (r.flag("has checksums")) {
    if (blobs_without_checksums.count({info.relative_path, info.offset}) != 0) {
      r.fail("checksums", "items naming the blob at " + std::to_string(info.offset) + " of " + info.relative_path +
                              " disagree on whether it has checksums");
    }
    ItemChecksums sums = decode_item_checksums(r, index, info, out.checksums);  // fails without out.checksums
    out.checksums->add(std::move(sums));
  } else {
    if (out.checksums && out.checksums->find(info.relative_path, info.offset)) {
      r.fail("checksums", "items naming the blob at " + std::to_string(info.offset) + " of " + info.relative_path +
                              " disagree on whether it has checksums");
    }
    blobs_without_checksums.emplace(info.relative_path, info.offset);
  }
  if (!out.metadata.storage_data.emplace(std::move(index), std::move(info)).second) {
    r.fail("storage item", "the same chunk appears twice");
  }
}

std::optional<format::StorageMeta> decode_storage_meta(Reader& r) {
  if (!r.flag("has storage_meta")) return std::nullopt;
  format::StorageMeta meta;
  meta.checkpoint_id = r.opt_str("checkpoint_id");
  meta.save_id = r.opt_str("save_id");
  meta.load_id = r.opt_str("load_id");
  meta.modules = r.strings("modules");
  return meta;
}

CheckpointIndex decode_fields(std::string_view index) {
  Reader r(index);
  r.u64("magic");
  if (const std::uint32_t version = r.u32("version"); version < kOldestVersion || version > kVersion) {
    r.fail("version", "expected " + std::to_string(kOldestVersion) + " to " + std::to_string(kVersion) + ", found " +
                          std::to_string(version));
  } else {
    r.set_version(version);
  }
  r.u64(".metadata length");
  r.u32(".metadata CRC-32C");
  CheckpointIndex out;
  const std::uint8_t algorithm = r.u8("checksum algorithm");
  const std::uint64_t block_size = r.u64("block size");
  if (algorithm > 2) r.fail("checksum algorithm", "expected 0, 1 or 2, found " + std::to_string(algorithm));
  if (algorithm != 0) {
    if (block_size == 0) r.fail("block size", "0 with checksums");
    out.checksums.emplace(algorithm == 1 ? ChecksumAlgorithm::kCrc32c : ChecksumAlgorithm::kXxh3, block_size);
  }
  const std::size_t entries = r.count("state_dict_metadata entries", 5);
  out.metadata.key_order.reserve(entries);
  for (std::size_t i = 0; i < entries; ++i) decode_entry(r, out.metadata);
  decode_planner_data(r, out.metadata);
  const std::size_t items = r.count("storage items", 30);
  std::set<std::pair<std::string, std::uint64_t>> blobs_without_checksums;
  for (std::size_t i = 0; i < items; ++i) decode_storage_item(r, out, blobs_without_checksums);
  out.metadata.storage_meta = decode_storage_meta(r);
  out.metadata.version = r.opt_str("version");
  if (!r.at_end()) r.fail("end", "unexpected bytes before the trailing CRC-32C");
  return out;
}

}  // namespace

CheckpointIndex decode_checkpoint_index(std::string_view index, std::string_view source_name) {
  const std::string source(source_name);
  if (index.size() < kHeaderBytes + kTrailerBytes || std::memcmp(index.data(), kMagic, sizeof kMagic) != 0) {
    throw FormatError(source + ": not a shardpoint checkpoint index (expected the magic \"SPINDEX\")");
  }
  try {
    return decode_fields(index.substr(0, index.size() - kTrailerBytes));
  } catch (const FormatError& e) {
    throw FormatError(source + ": " + e.what());
  }
}

}  // namespace shardpoint::engine
