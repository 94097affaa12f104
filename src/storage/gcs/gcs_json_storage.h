// The Google Cloud Storage JSON API with an OAuth2 bearer token: the "gs://" driver when
// GOOGLE_OAUTH_ACCESS_TOKEN is set and no HMAC keys are (gcs_storage.h chooses).
//
// Objects live in one bucket under a key prefix, as in the S3 driver: "gs://b/ckpt/run1"
// roots the storage at "ckpt/run1/". Every request carries "Authorization: Bearer TOKEN".
//
// Protocol (https://cloud.google.com/storage/docs/json_api), object names percent-encoded
// as one path segment ('/' too):
//   - stat():  GET  {endpoint}/storage/v1/b/BUCKET/o/NAME           (JSON: size, generation)
//   - read():  GET  {endpoint}/download/storage/v1/b/BUCKET/o/NAME?alt=media with Range,
//              split into parallel ranged GETs above parallel_read_bytes.
//   - open_source(): objects up to source_whole_bytes are fetched whole; larger ones lazily
//              through read-ahead windows (http/ranged_reads.h), every GET pinned to the
//              generation seen at open with ifGenerationMatch: a replaced object fails with
//              StorageError kOther instead of mixing versions.
//   - writers (http/upload_writer.h): bytes staged in BufferPool buffers. An object that fits in one chunk is one
//              POST {endpoint}/upload/storage/v1/b/BUCKET/o?uploadType=media&name=NAME at
//              commit(). A larger one opens a resumable session (uploadType=resumable; the
//              session URI comes back in Location) when the first chunk is full and PUTs
//              chunks of a multiple of 256 KiB with "Content-Range: bytes A-B/*"; the last
//              says the total. GCS takes a session's chunks in order: by default a writer
//              uploads its full chunk and then refills the same buffer (one buffer per
//              writer; overlap_chunks: one chunk uploads while the next fills, two buffers
//              per writer). The object appears in one step when the last chunk lands. A
//              writer destroyed without commit(), or after a failed append() or commit(),
//              DELETEs the session: nothing is published.
//              A 308 whose Range shows fewer bytes persisted than sent resends the rest.
//   - write_atomic(): one uploadType=media POST (GCS publishes an object whole).
//   - WriteOptions::if_absent: ifGenerationMatch=0 on the media POST or the session's POST
//              (GCS checks it there and when the session completes); 412 is StorageError
//              kAlreadyExists (features(): conditional_put).
//   - integrity: the request that creates an object (the media POST, the last chunk) carries
//              "X-Goog-Hash: crc32c=..." of the whole object (a running CRC-32C over the
//              chunks as they are sent). GCS refuses a mismatch with 400 and creates no
//              object. The request is retried: that mends a damaged media POST or last chunk.
//              An earlier chunk damaged on the way was stored as received (GCS checks no
//              chunk on its own), so every retry is refused too and the upload fails, with
//              nothing published.
//   - list():  GET {endpoint}/storage/v1/b/BUCKET/o?prefix=P&pageToken=T (paged by
//              nextPageToken). remove(): DELETE .../o/NAME. remove_prefix(): list, then
//              parallel deletes (unfinished resumable sessions are never visible and expire).
// Retries: http::HttpClient (5xx, 429, resets, timeouts, malformed answers, wrong ranges,
// bodies refused by their X-Goog-Hash; exponential backoff, full jitter).
// Errors: StorageError naming `GCS object "gs://b/p/key"`, the HTTP status and GCS's error
// message, the retry count. 404 -> kNotFound; 401/403 -> kPermission, saying the token came
// from GOOGLE_OAUTH_ACCESS_TOKEN (never the token); 5xx/429/transport and refused bodies
// after retries -> kTransient. Session URIs (which authorize an upload) are never printed either.
// Features: range_reads, atomic_publish, conditional_put, object_store (a session's chunks
// go one at a time: the engine writes several objects per rank, engine/save_plan.h).
// Thread-safety: as storage.h.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "storage/http/http_client.h"

namespace shardpoint::storage::gcs {

struct GcsJsonConfig {
  std::string bucket;
  std::string prefix;                                      // no leading or trailing '/'; "" = bucket root
  std::string query;                                       // the URL's query as given, kept so url() round-trips
  std::string endpoint;                                    // scheme://host[:port], no trailing '/'
  std::string token;                                       // OAuth2 access token; secret, never printed
  std::string token_source = "GOOGLE_OAUTH_ACCESS_TOKEN";  // named in permission errors
  http::RetryPolicy retry;

  // --- performance ---
  // Resumable upload chunk; 0 = the pool's buffer size. Rounded down to a multiple of
  // 256 KiB (GCS's rule), at least 256 KiB. A session takes one chunk at a time, so every
  // chunk is a round trip with nothing else in flight for that object: larger chunks mean
  // fewer of them (32 MiB: 31 PUTs per GB instead of 8 MiB's 122, a 1.6x faster 4-rank save
  // on fake-gcs-server; 64 MiB: 15 per GB, the google-cloud-storage SDK's count, with less
  // rehashing by fake-gcs-server). Cost: chunks are staged in a pool of the
  // storage's own when the given pool's buffers are smaller (or none is given), one per
  // writer at work (two with overlap_chunks), for as many writers at work as
  // StorageOptions::default_pool_bytes / 16 MiB (4: a save's 4 objects per rank; 256 MiB of
  // 64 MiB chunks); more writers wait for a buffer. SHARDPOINT_GCS_CHUNK_MB overrides it for
  // gs:// URLs.
  std::size_t chunk_bytes = std::size_t{64} << 20;
  // Whether a writer fills its next chunk while the last one uploads
  // (http::UploadLimits::overlap_fill). Off: one chunk buffer per writer and append() waits
  // for each chunk's PUT; a save's other sessions (4 per rank) keep the server busy
  // meanwhile, and the memory a second buffer would take goes into chunks twice the size.
  // Turn it on for a writer that uploads alone (it then holds two chunks).
  bool overlap_chunks = false;
  // As S3Config: parallel ranged GETs for large reads, lazy sources with read-ahead windows.
  std::size_t parallel_read_bytes = std::size_t{16} << 20;
  std::size_t read_chunk_bytes = std::size_t{8} << 20;
  int read_threads = 8;
  std::size_t source_whole_bytes = std::size_t{1} << 20;
  std::size_t source_window_bytes = std::size_t{8} << 20;
  int source_cache_windows = 8;
  // maxResults of a list page (GCS caps it at 1000).
  int list_page_size = 1000;
};

// A storage for config (no I/O: a missing bucket or bad token shows at the first request).
std::unique_ptr<Storage> make_gcs_json_storage(GcsJsonConfig config, const StorageOptions& options = {});

}  // namespace shardpoint::storage::gcs
