#include "cli/checkpoint_listing.h"

#include <sys/stat.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/output.h"
#include "core/checksum.h"
#include "engine/checkpoint_location.h"
#include "pickle/repr.h"
#include "shardpoint/error.h"
#include "shardpoint/location.h"
#include "shardpoint/reshard.h"

namespace shardpoint::cli {

std::unique_ptr<CheckpointListing> open_listing(const Location& where, bool check_zip_crc) {
  engine::CheckpointLocation location = engine::locate_checkpoint(where);
  if (location.is_folder()) return open_dcp_listing(location, check_zip_crc);
  if (!location.local_file.empty()) return open_torch_listing(location.local_file, check_zip_crc);
  return open_torch_listing(
      location.name, [&] { return engine::open_torch_source(location); }, check_zip_crc);
}

const char* storage_url_help() {
  return "Paths may be storage URLs: s3://BUCKET/PREFIX (credentials AWS_ACCESS_KEY_ID +\n"
         "AWS_SECRET_ACCESS_KEY [+ AWS_SESSION_TOKEN], or AWS_PROFILE / ~/.aws/credentials;\n"
         "AWS_REGION; AWS_ENDPOINT_URL for S3-compatible servers), gs://BUCKET/PREFIX\n"
         "(GCS_HMAC_ACCESS_ID + GCS_HMAC_SECRET, or GOOGLE_OAUTH_ACCESS_TOKEN; GCS_ENDPOINT_URL,\n"
         "GCS_JSON_ENDPOINT_URL with a token),\n"
         "az://CONTAINER/PREFIX or abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX\n"
         "(AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or\n"
         "AZURE_STORAGE_SAS_TOKEN; AZURE_STORAGE_BLOB_ENDPOINT), file:///ABS/PATH. Secrets are\n"
         "never printed; authentication errors name the variable the credentials came from.\n";
}

std::string object_repr(const pickle::Value& object, const torchfile::TorchFile& file) {
  pickle::ReprOptions options;
  options.node_text = [&](const pickle::Value& node) -> std::optional<std::string> {
    const torchfile::TensorInfo* t = file.tensor_of(node);
    if (t == nullptr) return std::nullopt;
    std::string text = fmt::format("{}({}, [{}]", t->is_parameter ? "Parameter" : "tensor", dtype_name(t->dtype),
                                   fmt::join(t->shape, ", "));
    if (t->requires_grad) text += ", requires_grad=True";
    if (t->location != "cpu") text += ", device='" + t->location + "'";
    return text + ")";
  };
  return pickle::repr(object, options);
}

std::string tensor_sha256(const CheckpointListing& listing, std::size_t i) {
  Sha256 sha;
  listing.stream_tensor(i, [&](ByteSpan piece) { sha.update(piece); });
  return sha.hex_digest();
}

std::string zip_crc_text(const engine::ZipCrcCounts& counts) {
  if (counts.records_checked == 0 && counts.records_partial == 0 && counts.records_no_checksum == 0) return {};
  std::string out =
      fmt::format("zip CRC-32: {} records checked ({})", counts.records_checked, human_bytes(counts.bytes_checked));
  if (counts.records_partial != 0) {
    out += fmt::format(", {} read only in part (unchecked)", counts.records_partial);
  }
  if (counts.records_no_checksum != 0) {
    out += fmt::format(", {} written without a CRC-32", counts.records_no_checksum);
  }
  return out;
}

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace

nlohmann::ordered_json listing_to_json(const CheckpointListing& listing, bool with_hash) {
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  nlohmann::ordered_json objects = nlohmann::ordered_json::object();
  const auto& entries = listing.entries();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ListingEntry& e = entries[i];
    if (e.is_tensor) {
      nlohmann::ordered_json t;
      t["dtype"] = std::string(dtype_name(e.dtype));
      t["shape"] = e.shape;
      if (with_hash) t["sha256"] = tensor_sha256(listing, i);
      tensors[e.key] = std::move(t);
    } else {
      objects[e.key] = e.repr;
    }
  }
  nlohmann::ordered_json out;
  out["format"] = listing.format();
  out["tensors"] = std::move(tensors);
  out["objects"] = std::move(objects);
  return out;
}

std::string listing_to_text(const CheckpointListing& listing, bool with_hash) {
  const auto& entries = listing.entries();
  std::size_t key_width = 3;
  std::uint64_t total = 0;
  std::size_t tensor_count = 0;
  for (const auto& e : entries) {
    key_width = std::max(key_width, e.key.size());
    if (e.is_tensor) {
      total += e.nbytes;
      ++tensor_count;
    }
  }
  key_width = std::min<std::size_t>(key_width, 72);
  std::string out = listing.description() + "\n";
  out +=
      fmt::format("{} tensors ({}), {} objects\n\n", tensor_count, human_bytes(total), entries.size() - tensor_count);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ListingEntry& e = entries[i];
    std::string key = e.key.empty() ? "<root>" : e.key;
    if (e.is_tensor) {
      out += fmt::format("  {:<{}}  {:<9} {:<18} {:>10}", key, key_width, dtype_name(e.dtype), shape_text(e.shape),
                         human_bytes(e.nbytes));
      if (!e.detail.empty()) out += "  " + e.detail;
      if (with_hash) out += "  sha256:" + tensor_sha256(listing, i);
    } else {
      out += fmt::format("  {:<{}}  = {}", key, key_width, e.repr);
    }
    out += "\n";
  }
  std::string layout = listing.layout_text();
  if (!layout.empty()) out += "\n" + layout;
  // After the hashes: what reading the data checked.
  if (const std::string crc = zip_crc_text(listing.zip_crc_counts()); with_hash && !crc.empty()) {
    out += "\n" + crc + "\n";
  }
  return out;
}

}  // namespace shardpoint::cli
