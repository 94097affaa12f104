// The "s3" driver (make_s3_storage). Objects live in one bucket under a key prefix:
// "s3://my-bucket/ckpt/run1" roots the storage at "ckpt/run1/", so key "__0_0.distcp" is the
// S3 object "ckpt/run1/__0_0.distcp". Also serves "gs://" through Google Cloud Storage's
// S3-interoperable XML API (gcs/gcs_storage.h builds the S3Config).
//
// URL: s3://BUCKET[/PREFIX][?KEY=VALUE&...], query keys (all optional):
//   region=us-west-2      default: AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config, us-east-1
//   endpoint=http://h:p   default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, profile endpoint_url,
//                         else https://s3.<region>.amazonaws.com
//   addressing=path|virtual   default: virtual for AWS, path for a custom endpoint
//   profile=NAME          credentials and config of this profile (aws_credentials.h)
// Any other key, a fragment, an invalid bucket name or prefix segment ("", ".", "..") is a
// UsageError naming the URL. Credentials: aws_credentials.h; none found = unsigned requests.
// Environment for tests and tuning: SHARDPOINT_HTTP_MAX_ATTEMPTS, SHARDPOINT_HTTP_BACKOFF_MS
// (RetryPolicy), SHARDPOINT_S3_PART_MB (multipart part size, >= 5), SHARDPOINT_S3_PARTS_IN_FLIGHT
// (S3Config::max_parallel_parts, 1-64), SHARDPOINT_S3_PAYLOAD (auto|signed|unsigned:
// S3Config::payload_signing).
//
// Protocol (AWS S3 REST, SigV4 signed by libcurl with x-amz-content-sha256 = the SHA-256 of
// the body, which S3 checks: a body damaged on the way is refused with 400
// XAmzContentSHA256Mismatch and sent again, as is one refused with BadDigest when
// content_md5 adds Content-MD5 or an UNSIGNED-PAYLOAD body its x-amz-checksum-crc32c
// (S3Config::payload_signing); http/body_checksum.h):
//   - writers (http/upload_writer.h) stage bytes in BufferPool buffers, or send the bytes
//     given to append_borrowed() from the caller's memory (a part is then a list of pieces,
//     the SHA-256 and CRC-32C computed as the bytes are appended). An object that fits
//     in one part is one PUT at commit(). A larger one starts a multipart upload when the
//     first part is full and uploads parts in parallel (at most max_parallel_parts in flight
//     per writer, each holding its pool buffer, so memory stays bounded by the pool);
//     commit() uploads the last part and completes the upload. A writer destroyed without
//     commit(), or after a failed append() or commit(), aborts the multipart upload, so
//     nothing half-written remains.
//   - write_atomic() is one PUT (a multipart upload above one part): S3 publishes an object
//     whole, so readers see the old or the new bytes. This is how `.metadata` is committed
//     after every data object (the engine's order), and a prefix without `.metadata` is no
//     checkpoint to any reader. WriteOptions::if_absent adds If-None-Match: * to the PUT or
//     to CompleteMultipartUpload; S3's 412 is StorageError kAlreadyExists (features():
//     conditional_put).
//   - checksums: x-amz-checksum-crc32c on every body (S3Config::checksum_crc32c).
//   - read() is a ranged GET, split into parallel ranged GETs above parallel_read_bytes.
//   - open_source() fetches objects up to source_whole_bytes at once (so the source keeps its
//     bytes after a replace or remove, as storage.h asks); larger objects are read lazily by
//     ranged GETs through a small read-ahead cache, and every response's ETag must match the
//     one seen at open: a replaced object fails with StorageError kOther instead of mixing
//     versions (S3 without versioning cannot serve the old bytes).
//   - list() is ListObjectsV2 (paged); remove_prefix() deletes the listed objects in parallel
//     and aborts unfinished multipart uploads under the prefix.
// Errors: StorageError naming the object (`S3 object "s3://b/p/key"`), the HTTP status, S3's
// error code and message, request id and retry count. 404 -> kNotFound, 401/403 ->
// kPermission (message says where the credentials came from, never the secret), 5xx/429,
// transport failures and bodies refused as damaged after retries -> kTransient.
// Features: range_reads, atomic_publish, conditional_put. No parallel_writes (parts must be
// appended), no local_path, no direct_io.
// Cancellation: checked at each call, before each HTTP attempt and during transfers.
// Thread-safety: all Storage methods are thread-safe; writers as storage.h says.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "storage/http/http_client.h"
#include "storage/s3/aws_credentials.h"

namespace shardpoint::storage::s3 {

struct S3Config {
  std::string scheme = "s3";   // of url() and messages ("gs" for GCS)
  std::string service = "S3";  // in messages: `S3 object "..."`
  std::string bucket;
  std::string prefix;    // no leading or trailing '/'; "" = bucket root
  std::string query;     // the URL's query as given, kept so url() round-trips
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  std::string region = "us-east-1";
  std::string sigv4_provider = "aws:amz";  // CURLOPT_AWS_SIGV4 "<provider>:<region>:s3"
  bool path_style = false;                 // endpoint/bucket/key instead of bucket.host/key
  AwsCredentials credentials;              // empty: unsigned requests
  http::RetryPolicy retry;
  // Content-MD5 on every request with a body, so the server refuses a damaged body (400
  // BadDigest). For services that check it but may not check x-amz-content-sha256 against
  // the body (GCS's XML API); S3 checks the SHA-256. Cost: an MD5 pass over every body.
  bool content_md5 = false;
  // x-amz-checksum-crc32c (base64 of the big-endian CRC-32C) on every PutObject and
  // UploadPart, x-amz-checksum-algorithm: CRC32C on CreateMultipartUpload and each part's
  // ChecksumCRC32C in CompleteMultipartUpload, as the AWS SDKs send them: S3 refuses a body
  // that does not match (400 BadDigest, retried) and keeps the checksum with the object
  // (HEAD with x-amz-checksum-mode: ENABLED; multipart: the CRC-32C of the parts' CRCs,
  // "-N"). Off for services that do not take S3's checksum headers (GCS's XML API).
  // Cost: one CRC-32C pass over every body (ISA-L: about 2 % of a save's client CPU).
  bool checksum_crc32c = true;
  // What x-amz-content-sha256 says of a PutObject or UploadPart body that
  // x-amz-checksum-crc32c covers (every other request signs the SHA-256 of its body):
  //   kAuto (default): UNSIGNED-PAYLOAD over https://, where TLS keeps the body intact on the
  //     way and S3 checks the CRC-32C against what arrived (the AWS SDKs do the same); the
  //     body's SHA-256 over plain http://, where only a signed hash stops someone on the path
  //     from changing the body (a CRC-32C is easily matched by whoever changes it).
  //   kUnsigned: UNSIGNED-PAYLOAD over http:// too; only for a link nobody else can touch
  //     (loopback, benchmarks). kSigned: always the SHA-256.
  // Unsigned saves a SHA-256 pass over every uploaded byte (0.6 s of CPU per GiB with
  // SHA-NI on a quiet machine, 1.5 s under load), and the server's check of it. A body damaged on
  // the way is then refused by its CRC-32C (400 BadDigest, retried) instead of its hash.
  // Needs checksum_crc32c; without it bodies are always signed.
  enum class PayloadSigning { kAuto, kSigned, kUnsigned };
  PayloadSigning payload_signing = PayloadSigning::kAuto;
  // The header of a create-only publish (WriteOptions::if_absent) on PutObject and
  // CompleteMultipartUpload; the service answers 412 when an object exists.
  std::string create_only_header = "If-None-Match: *";

  // --- performance ---
  // Size of the first multipart parts; 0 = the pool's buffer size. Parts below 5 MiB (S3's
  // minimum) are raised to 5 MiB with a pool of the driver's own. Parts double after every
  // 1,000 (http/upload_writer.h part_bytes_at), so no object needs more than S3's 10,000
  // parts; keep it at most 10 MiB so the largest (x 512) stay within S3's 5 GiB per part.
  std::size_t part_bytes = 0;
  // Parts of one writer in flight at once. Each holds a pool buffer; the driver's own pool
  // (no StorageOptions::buffer_pool) holds at least max_parallel_parts + 1 parts. boto3 keeps
  // 10 per object, but it streams parts from a file; ours are staged in memory, and on 2
  // shared cores 10 in flight cost 8 % more client CPU (the buffers' first touch) and were
  // no faster on s3s-fs or moto than 4. Raise it for a
  // server far away or slow per request, where each part waits on the round trip.
  int max_parallel_parts = 4;
  // read() and sources split reads at least this large into parallel ranged GETs of
  // read_chunk_bytes, at most read_threads at once.
  std::size_t parallel_read_bytes = std::size_t{16} << 20;
  std::size_t read_chunk_bytes = std::size_t{8} << 20;
  int read_threads = 8;
  // open_source() reads objects up to this size whole; larger ones lazily with a cache of
  // source_cache_windows windows of source_window_bytes (http/ranged_reads.h): the engine
  // reads each blob's headers, small items and data in pieces in order, so one window
  // serves several reads. Each GET costs a round trip (and moto copies the whole object per
  // GET), so windows are large; a window's GET covers what the engine announced it will
  // read (a lone small item is a small GET), and reads of a window or more go straight
  // into the caller's buffer. A load reads about one place of a blob per reader thread at
  // once: twice as many windows as the default reader threads keep them from evicting each
  // other (a 0.4 GB load with 4 threads over moto: 139 GETs with 4 windows, 88 with 8).
  // Cost: windows x size (64 MiB) for all of a storage's open sources together (one
  // budget they share, http/ranged_reads.h ReadAheadBudget), plus a window per reader
  // thread that misses when the budget is full.
  std::size_t source_whole_bytes = std::size_t{1} << 20;
  std::size_t source_window_bytes = std::size_t{8} << 20;
  int source_cache_windows = 8;
};

// The configuration of an s3:// location (see the top of this file: its bucket, prefix and
// query keys checked), with credentials, region and endpoint resolved from the environment.
// Throws UsageError naming the URL for what the driver does not take.
S3Config s3_config(const Location& location);

// True when config's PutObject and UploadPart bodies go with x-amz-content-sha256:
// UNSIGNED-PAYLOAD (S3Config::payload_signing, checksum_crc32c and the endpoint's scheme).
bool sends_unsigned_payload(const S3Config& config);

// Applies SHARDPOINT_HTTP_MAX_ATTEMPTS / SHARDPOINT_HTTP_BACKOFF_MS / SHARDPOINT_S3_PART_MB /
// SHARDPOINT_S3_PAYLOAD. Throws UsageError naming the variable for a value it does not take.
void apply_tuning_environment(S3Config& config);

// A storage for config (no I/O: a missing bucket shows at the first request).
std::unique_ptr<Storage> make_s3_storage(S3Config config, const StorageOptions& options = {});

// Registry entry for "s3://...".
std::unique_ptr<Storage> open_s3_storage(const Location& location, const StorageOptions& options);

// Checks an S3 bucket name (3-63 of a-z 0-9 . -, starting and ending alphanumeric; GCS also
// allows '_' and up to 222 characters with dots when gcs_rules). Throws UsageError naming url.
void validate_bucket_name(std::string_view bucket, std::string_view url, bool gcs_rules);

// Sets config's scheme, bucket, prefix and query from a location of `scheme` (s3 or gs) and
// returns its query options; checks the bucket name and prefix segments (none empty, ".",
// ".." or a temporary name). Throws UsageError naming the URL.
std::vector<std::pair<std::string, std::string>> use_bucket_location(const Location& location, Scheme scheme,
                                                                     S3Config& config, bool gcs_rules);

}  // namespace shardpoint::storage::s3
