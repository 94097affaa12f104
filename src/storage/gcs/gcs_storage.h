// The "gs" driver: Google Cloud Storage. gs://BUCKET[/PREFIX][?endpoint=URL]
//
// Two protocols, chosen by the credentials found:
//   1. HMAC keys (GCS_HMAC_ACCESS_ID + GCS_HMAC_SECRET): GCS's S3-interoperable XML API,
//      served by the S3 driver (s3/s3_storage.h) with SigV4 (region "auto"), path-style
//      URLs, multipart uploads and ranged GETs. Endpoint: ?endpoint=, else GCS_ENDPOINT_URL,
//      else https://storage.googleapis.com.
//   2. An OAuth2 bearer token (GOOGLE_OAUTH_ACCESS_TOKEN) and no HMAC keys: the JSON API
//      (gcs_json_storage.h). Endpoint: ?endpoint=, else GCS_JSON_ENDPOINT_URL, else
//      https://storage.googleapis.com.
// No credentials at all: the XML API, unsigned (public buckets only).
// Query keys other than `endpoint` are a UsageError naming the URL; bucket names follow
// GCS's rules (a-z 0-9 . - _, 3-63 characters, up to 222 with dots).
// Secrets are never printed; errors say which variable the credentials came from.
// Thread-safety: as storage.h.
#pragma once

#include <memory>
#include <string_view>

#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"

namespace shardpoint::storage::gcs {

// Registry entry for "gs://...". Throws UsageError for a bad URL.
std::unique_ptr<Storage> open_gcs_storage(const Location& location, const StorageOptions& options);

}  // namespace shardpoint::storage::gcs
