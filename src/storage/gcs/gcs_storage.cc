#include "storage/gcs/gcs_storage.h"

#include <cstdlib>

#include "shardpoint/error.h"
#include "storage/gcs/gcs_json_storage.h"
#include "storage/s3/s3_storage.h"

namespace shardpoint::storage::gcs {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

std::unique_ptr<Storage> open_gcs_storage(const Location& location, const StorageOptions& options) {
  s3::S3Config config;
  auto pairs = s3::use_bucket_location(location, Scheme::kGcs, config, /*gcs_rules=*/true);
  const std::string& url = location.text();
  std::string endpoint;
  for (const auto& [k, v] : pairs) {
    if (k == "endpoint") {
      endpoint = v;
    } else {
      throw UsageError("storage URL \"" + std::string(url) + "\": unknown query key \"" + k +
                       "\" (accepted: endpoint)");
    }
  }
  const std::string access_id = env("GCS_HMAC_ACCESS_ID");
  const std::string secret = env("GCS_HMAC_SECRET");
  const std::string token = env("GOOGLE_OAUTH_ACCESS_TOKEN");
  const bool use_json = (access_id.empty() || secret.empty()) && !token.empty();
  if (endpoint.empty()) endpoint = env(use_json ? "GCS_JSON_ENDPOINT_URL" : "GCS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = "https://storage.googleapis.com";
  while (endpoint.ends_with('/')) endpoint.pop_back();
  if (!endpoint.starts_with("http://") && !endpoint.starts_with("https://")) {
    throw UsageError("storage URL \"" + std::string(url) + "\": endpoint \"" + endpoint +
                     "\" must start with http:// or https://");
  }
  s3::apply_tuning_environment(config);  // retry policy (and part size, unused by JSON)
  if (use_json) {
    GcsJsonConfig json;
    json.bucket = config.bucket;
    json.prefix = config.prefix;
    json.query = config.query;
    json.endpoint = endpoint;
    json.token = token;
    json.retry = config.retry;
    // SHARDPOINT_GCS_CHUNK_MB: the resumable upload's chunk in MiB (GcsJsonConfig::chunk_bytes).
    if (const long chunk_mb = std::strtol(env("SHARDPOINT_GCS_CHUNK_MB").c_str(), nullptr, 10); chunk_mb > 0) {
      json.chunk_bytes = static_cast<std::size_t>(chunk_mb) << 20;
    }
    return make_gcs_json_storage(std::move(json), options);
  }
  config.service = "GCS";
  config.endpoint = endpoint;
  config.region = "auto";
  config.path_style = true;
  config.content_md5 = true;  // GCS checks Content-MD5 of a body (400 BadDigest)
  // GCS's XML API takes its own checksum and precondition headers, not S3's.
  config.checksum_crc32c = false;
  config.create_only_header = "x-goog-if-generation-match: 0";
  if (!access_id.empty() && !secret.empty()) {
    config.credentials.access_key_id = access_id;
    config.credentials.secret_access_key = secret;
    config.credentials.source = "environment (GCS_HMAC_ACCESS_ID)";
  }
  return s3::make_s3_storage(std::move(config), options);
}

namespace {
const StorageRegistration kGcsRegistration{"gs", &open_gcs_storage};  // gs://bucket/prefix
}  // namespace

}  // namespace shardpoint::storage::gcs
