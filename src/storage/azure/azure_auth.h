// Azure Blob credentials and request signing: where the account, key or SAS come from, and
// the SharedKey signature (HMAC-SHA256, OpenSSL) over a request's canonical form.
//
// Credentials, first match wins (azure_config_from_env()):
//   1. AZURE_STORAGE_CONNECTION_STRING: "AccountName=..;AccountKey=..;BlobEndpoint=..",
//      "SharedAccessSignature=..", "DefaultEndpointsProtocol", "EndpointSuffix",
//      "UseDevelopmentStorage=true" (Azurite on 127.0.0.1:10000, devstoreaccount1).
//   2. AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN.
//   AZURE_STORAGE_BLOB_ENDPOINT overrides the endpoint of either (a custom endpoint without a
//   connection string). Without an endpoint the driver uses https://<account>.blob.<suffix>.
// Test and tuning knobs: SHARDPOINT_AZURE_MAX_ATTEMPTS, SHARDPOINT_AZURE_BACKOFF_MS (base),
// SHARDPOINT_AZURE_BACKOFF_MAX_MS.
//
// Secrets (the account key, the SAS signature) never appear in what this layer returns for
// messages: AzureConfig::describe() shows which kind of credential is used, not its value.
//
// Protocol facts (Azure Storage REST docs, "Authorize with Shared Key"):
//   StringToSign = VERB \n Content-Encoding \n Content-Language \n Content-Length (empty when 0)
//                  \n Content-MD5 \n Content-Type \n Date \n If-Modified-Since \n If-Match \n
//                  If-None-Match \n If-Unmodified-Since \n Range \n CanonicalizedHeaders
//                  CanonicalizedResource
//   CanonicalizedHeaders: every x-ms-* header, lower-cased, sorted, "name:value\n".
//   CanonicalizedResource: "/" account uri-path, then "\nname:value" per query parameter
//                  (lower-cased names, sorted, decoded values).
//
// Thread-safety: pure functions; AzureConfig is a value.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/base64.h"
#include "storage/http/http_client.h"

namespace shardpoint::storage::azure {

struct AzureConfig {
  // --- credentials (one of account_key / sas_token; neither = anonymous requests) ---
  std::string account;
  std::string account_key;  // base64, as the portal shows it. Secret.
  std::string sas_token;    // without a leading '?'. Secret.
  // "http://127.0.0.1:10000/devstoreaccount1" (path-style, Azurite) or
  // "https://acct.blob.core.windows.net". Empty: https://<account>.blob.<endpoint_suffix>.
  std::string blob_endpoint;
  std::string endpoint_suffix = "core.windows.net";
  std::string protocol = "https";

  // --- retries (5xx, 408, 429, connection resets, timeouts) ---
  // Tries per request, the first included. Backoff before retry n (1-based) is
  // min(backoff_max, backoff_base * 2^(n-1)) scaled by a random factor in [0.5, 1]. Tests
  // lower these so failures return quickly.
  int max_attempts = 6;
  std::chrono::milliseconds backoff_base{200};
  std::chrono::milliseconds backoff_max{10000};
  // TCP connect limit per attempt; a transfer slower than 1 KiB/s for stall_timeout fails
  // (and is retried).
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds stall_timeout{60000};

  // --- performance ---
  // Concurrent Put Block requests per writer and ranged GETs per large read. Each in-flight
  // block holds one buffer of the storage's BufferPool.
  std::size_t parallelism = 8;
  // Ranged GET size when a large read is split.
  std::size_t read_chunk_bytes = std::size_t{8} << 20;
  // open_source() downloads objects up to this size whole (so the source keeps its bytes
  // after the blob is replaced or deleted); larger ones are read with ranged GETs pinned to
  // the ETag seen at open (a replaced blob then gives an error, never mixed bytes), through
  // a cache of source_cache_windows blocks of source_window_bytes (http/ranged_reads.h, as
  // S3 and GCS). Small, because a load opens other ranks' files for a few small items (the
  // scalars and blobs DCP spreads over ranks): at 32 MiB, a 0.34 GB load on 4 ranks with 4
  // objects per rank downloaded every 21 MB object whole in every rank, 4x the bytes and
  // 0.42x azure-storage-blob's speed. Every GET costs a round trip (and a request to
  // Azurite's one process), so blocks are large; reads of a block or more go straight to
  // the caller's buffer.
  // Cost: windows x size (64 MiB) for all of a storage's open sources together (one
  // budget they share), plus a window per reader thread that misses when it is full.
  std::size_t source_whole_bytes = std::size_t{1} << 20;
  std::size_t source_window_bytes = std::size_t{8} << 20;
  int source_cache_windows = 8;
  // List Blobs page size (the service caps it at 5000).
  int list_page_size = 5000;
  std::string api_version = "2021-12-02";

  // "SharedKey for account a", "SAS for account a", "anonymous": for messages, no secrets.
  std::string describe() const;
};

// Parses a connection string (";"-separated key=value; unknown keys are ignored as the SDKs
// do). Throws UsageError naming the bad part (never a value) for a malformed string.
AzureConfig parse_connection_string(std::string_view connection_string);

// The configuration the environment describes (see the top of this file); an empty account
// when nothing is set. Throws UsageError for a malformed connection string.
AzureConfig azure_config_from_env();

// Base64 (standard alphabet, padded): the shared one.
using shardpoint::base64_encode;
// The bytes of base64 text (surrounding whitespace ignored). Throws UsageError ("invalid
// base64 in <what>") on bad input.
std::string base64_decode(std::string_view text, std::string_view what);
// Percent-encodes all but A-Z a-z 0-9 - _ . ~ (and '/' when keep_slash): the shared one.
using http::uri_encode;
// Decodes %XX (and '+' as a space only when plus_is_space).
std::string uri_decode(std::string_view s, bool plus_is_space = false);

struct SignedRequest {
  std::string method;
  std::string path;                                          // encoded URI path, e.g. "/devstoreaccount1/c/dir/key"
  std::vector<std::pair<std::string, std::string>> query;    // decoded name/value
  std::vector<std::pair<std::string, std::string>> headers;  // includes x-ms-*; Content-Type
  std::uint64_t content_length = 0;
};

// "SharedKey <account>:<signature>" for the request. REQUIRES: config.account_key set.
std::string shared_key_authorization(const AzureConfig& config, const SignedRequest& request);

// An account SAS token (no leading '?') signed with the account key: services "b",
// resource types "sco", `permissions` such as "rwdlac", valid until `expiry` (UTC,
// "2030-01-01T00:00:00Z"). Version 2020-12-06 string-to-sign.
std::string make_account_sas(const AzureConfig& config, std::string_view permissions, std::string_view expiry);

// A service SAS for one container (sr=c), `permissions` such as "rwdl".
std::string make_container_sas(const AzureConfig& config, std::string_view container, std::string_view permissions,
                               std::string_view expiry);

}  // namespace shardpoint::storage::azure
