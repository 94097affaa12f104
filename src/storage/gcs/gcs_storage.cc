#include "storage/gcs/gcs_storage.h"

#include <cstdlib>

#include "core/error.h"
#include "storage/s3/s3_storage.h"

namespace shardpoint::storage::gcs {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

std::unique_ptr<Storage> open_gcs_storage(std::string_view url, const StorageOptions& options) {
  s3::S3Config config;
  auto pairs = s3::split_bucket_url(url, "gs", config, /*gcs_rules=*/true);
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
  if (use_json) {
    throw UsageError("storage URL \"" + std::string(url) +
                     "\": the GCS JSON API (GOOGLE_OAUTH_ACCESS_TOKEN) is not implemented yet; "
                     "use HMAC keys (GCS_HMAC_ACCESS_ID, GCS_HMAC_SECRET)");
  }
  config.service = "GCS";
  config.endpoint = endpoint;
  config.region = "auto";
  config.path_style = true;
  if (!access_id.empty() && !secret.empty()) {
    config.credentials.access_key_id = access_id;
    config.credentials.secret_access_key = secret;
    config.credentials.source = "environment (GCS_HMAC_ACCESS_ID)";
  }
  s3::apply_tuning_environment(config);
  return s3::make_s3_storage(std::move(config), options);
}

namespace {
const StorageRegistration kGcsRegistration{"gs", &open_gcs_storage};  // gs://bucket/prefix
}  // namespace

}  // namespace shardpoint::storage::gcs
