#include "storage/gcs/gcs_json_storage.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "core/buffer_pool.h"
#include "core/checksum.h"
#include "shardpoint/error.h"
#include "storage/http/body_checksum.h"
#include "storage/http/object_store.h"
#include "storage/http/ranged_reads.h"
#include "storage/http/upload_writer.h"

namespace shardpoint::storage::gcs {
namespace {

constexpr std::size_t kChunkQuantum = std::size_t{256} << 10;  // GCS: chunks are multiples of 256 KiB

using http::retries_text;

// GCS sends int64 fields (size, generation) as JSON strings.
std::uint64_t json_u64(const nlohmann::json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  if (it->is_string()) return std::strtoull(it->get<std::string>().c_str(), nullptr, 10);
  if (it->is_number_unsigned()) return it->get<std::uint64_t>();
  return 0;
}

std::string json_string(const nlohmann::json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number()) return it->dump();
  return {};
}

// ---------------------------------------------------------------------------------------
// The shared state of a storage, its writers and sources.

struct GcsCore final : http::ObjectClient {
  GcsJsonConfig config;
  http::HttpClient client;
  std::shared_ptr<BufferPool> pool;
  std::size_t chunk_bytes = 0;

  GcsCore(GcsJsonConfig c, const StorageOptions& options) : config(std::move(c)), client(config.retry) {
    std::size_t wanted = config.chunk_bytes;
    std::shared_ptr<BufferPool> given = options.buffer_pool;
    if (wanted == 0) wanted = given ? given->buffer_bytes() : std::size_t{8} << 20;
    wanted = std::max(kChunkQuantum, wanted / kChunkQuantum * kChunkQuantum);
    if (given && given->buffer_bytes() >= wanted) {
      pool = given;
    } else {
      // A chunk per writer at work (two with overlap_chunks: the one being filled and the
      // one uploading), for default_pool_bytes / 16 MiB writers (at least 1); allocated as used.
      const std::size_t writers = std::max<std::size_t>(options.default_pool_bytes / (std::size_t{16} << 20), 1);
      pool = std::make_shared<BufferPool>(
          http::upload_pool_options(wanted, writers * (config.overlap_chunks ? 2 : 1) * wanted));
    }
    chunk_bytes = wanted;
  }

  std::string object_name(std::string_view key) const {
    return config.prefix.empty() ? std::string(key) : config.prefix + "/" + std::string(key);
  }
  std::string root_url() const override {
    return "gs://" + config.bucket + (config.prefix.empty() ? "" : "/" + config.prefix);
  }
  std::string describe(std::string_view key) const override {
    return "GCS object \"" + root_url() + "/" + std::string(key) + "\"";
  }
  http::SourceLimits source_limits() const override {
    return {config.source_whole_bytes, config.source_window_bytes, config.source_cache_windows};
  }

  std::string bucket_path(std::string_view api) const {
    return config.endpoint + std::string(api) + "/storage/v1/b/" + http::uri_encode(config.bucket, false) + "/o";
  }
  std::string metadata_url(std::string_view key) const {
    return bucket_path("") + "/" + http::uri_encode(object_name(key), /*keep_slash=*/false);
  }
  std::string media_url(std::string_view key) const {
    return bucket_path("/download") + "/" + http::uri_encode(object_name(key), false) + "?alt=media";
  }
  // if_absent: ifGenerationMatch=0, GCS's "only if there is no live object" (412 otherwise).
  std::string upload_url(std::string_view type, std::string_view key, bool if_absent) const {
    return bucket_path("/upload") + "?uploadType=" + std::string(type) +
           "&name=" + http::uri_encode(object_name(key), false) + (if_absent ? "&ifGenerationMatch=0" : "");
  }

  http::Request request(std::string method, std::string url, ByteSpan body = {}) const {
    http::Request r;
    r.method = std::move(method);
    r.url = std::move(url);
    r.body = body;
    if (!config.token.empty()) r.headers.push_back("Authorization: Bearer " + config.token);
    return r;
  }

  [[noreturn]] void fail(const std::string& what, const http::Response& r) const {
    // A body refused after every attempt was damaged on the way each time (or, for the last
    // chunk, an earlier chunk was): uploading again may succeed.
    const StorageError::Kind kind =
        http::gcs_json_body_mismatch(r) ? StorageError::Kind::kTransient : http::error_kind(r.status);
    std::string text = what + ": HTTP " + std::to_string(r.status);
    auto body = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_object() && body.contains("error") && body["error"].is_object()) {
      std::string message = json_string(body["error"], "message");
      if (!message.empty()) text += ": " + message;
    }
    if (r.status == 404 && text.find(':', what.size() + 1) == std::string::npos) text += " (no such object)";
    if (kind == StorageError::Kind::kPermission) {
      text += config.token.empty()
                  ? " (no bearer token: set " + config.token_source + ")"
                  : " (the bearer token from " + config.token_source +
                        " was refused: expired, or without access to bucket \"" + config.bucket + "\")";
    }
    if (!r.request_id.empty()) text += " (request id " + r.request_id + ")";
    text += " (" + retries_text(r.retries) + ")";
    throw StorageError(kind, text);
  }

  // GET .../o/NAME: size and generation; nullopt for 404.
  std::optional<Version> head(std::string_view key, const IoOptions& io, const std::string& op) override {
    std::string what = op + " " + describe(key);
    http::Response resp = client.execute(request("GET", metadata_url(key)), io, what);
    if (resp.status == 404) return std::nullopt;
    if (resp.status != 200) fail(what, resp);
    auto j = nlohmann::json::parse(resp.body, nullptr, false);
    if (!j.is_object() || !j.contains("size")) {
      throw StorageError(StorageError::Kind::kOther, what + ": the object resource has no \"size\"");
    }
    return Version{json_u64(j, "size"), json_string(j, "generation")};
  }

  // One ranged GET into out, of the given generation when it is not empty.
  void get_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io,
                 const std::string& op, const std::string& generation) {
    std::string url = media_url(key);
    if (!generation.empty()) url += "&ifGenerationMatch=" + generation;
    http::Request r = request("GET", std::move(url));
    r.headers.push_back("Range: bytes=" + std::to_string(offset) + "-" + std::to_string(offset + out.size() - 1));
    r.body_out = out;
    r.use_body_out = true;
    r.expect_range = http::ByteRange{offset, out.size()};
    std::string what = op + " " + describe(key);
    http::Response resp = client.execute(r, io, what);
    if (resp.status == 416 || ((resp.status == 206 || resp.status == 200) && resp.bytes_received < out.size())) {
      throw FormatError(what + ": range [" + std::to_string(offset) + ", " + std::to_string(offset + out.size()) +
                        ") extends past the end of the object (got " + std::to_string(resp.bytes_received) + " of " +
                        std::to_string(out.size()) + " bytes)");
    }
    if (resp.status == 412) {
      throw StorageError(StorageError::Kind::kOther,
                         what + ": the object changed since it was opened (generation " + generation + ")");
    }
    if (resp.status == 200 && offset != 0) {
      throw StorageError(StorageError::Kind::kOther, what + ": server ignored the Range header");
    }
    if (resp.status != 206 && resp.status != 200) fail(what, resp);
  }

  void read_into(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io,
                 const std::string& op, const std::string& generation) override {
    http::read_in_parallel(
        offset, out, config.parallel_read_bytes, config.read_chunk_bytes, config.read_threads,
        [&](std::uint64_t at, std::span<std::byte> part) { get_range(key, at, part, io, op, generation); });
  }

  // The request carries X-Goog-Hash of the object whose CRC-32C is crc, and is retried
  // when GCS refuses its body for not matching it.
  static void add_hash(http::Request& r, std::uint32_t crc) {
    r.headers.push_back("X-Goog-Hash: " + http::goog_hash_crc32c(crc));
    r.body_mismatch = &http::gcs_json_body_mismatch;
  }

  // uploadType=media: the whole object in one request, published in one step.
  void put(std::string_view key, ByteSpan data, const IoOptions& io, const std::string& op,
           const WriteOptions& options) override {
    put_media(key, data, options.if_absent, io, op);
  }

  void put_media(std::string_view key, ByteSpan data, bool if_absent, const IoOptions& io, const std::string& op) {
    std::string what = op + " " + describe(key);
    http::Request r = request("POST", upload_url("media", key, if_absent), data);
    r.headers.push_back("Content-Type: application/octet-stream");
    add_hash(r, crc32c(0, data));
    http::Response resp = client.execute(r, io, what);
    if (if_absent && resp.status == 412) throw http::conflict_error(what, resp.status, "conditionNotMet");
    if (resp.status != 200 && resp.status != 201) fail(what, resp);
  }

  // Opens a resumable upload session; returns its URI (secret: it authorizes the upload).
  // GCS checks ifGenerationMatch when the session opens and again when it completes.
  std::string start_session(std::string_view key, bool if_absent, const IoOptions& io) {
    std::string what = "start resumable upload of " + describe(key);
    http::Request r = request("POST", upload_url("resumable", key, if_absent));
    r.headers.push_back("X-Upload-Content-Type: application/octet-stream");
    http::Response resp = client.execute(r, io, what);
    if (if_absent && resp.status == 412) throw http::conflict_error(what, resp.status, "conditionNotMet");
    if (resp.status != 200 && resp.status != 201) fail(what, resp);
    std::string location = resp.header("location");
    if (location.empty()) throw StorageError(StorageError::Kind::kOther, what + ": response has no Location");
    return location;
  }

  // The last chunk of an upload: the object's size, and the CRC-32C of all its bytes.
  struct Last {
    std::uint64_t total = 0;
    std::uint32_t crc = 0;
  };

  // PUTs data at `offset` of the session; `last` for the last chunk (nullopt: more follow).
  // Resends what a 308 says did not persist.
  void put_chunk(const std::string& session, std::string_view key, std::uint64_t offset, ByteSpan data,
                 std::optional<Last> last, const IoOptions& io) {
    const std::uint64_t end = offset + data.size();
    std::string what = "upload bytes " + std::to_string(offset) + "-" + std::to_string(end) + " of " + describe(key);
    std::uint64_t at = offset;
    for (int round = 0; round < 8; ++round) {
      ByteSpan rest = data.subspan(static_cast<std::size_t>(at - offset));
      http::Request r = request("PUT", session, rest);
      std::string size = last ? std::to_string(last->total) : "*";
      r.headers.push_back(rest.empty() ? "Content-Range: bytes */" + size
                                       : "Content-Range: bytes " + std::to_string(at) + "-" + std::to_string(end - 1) +
                                             "/" + size);
      if (last) add_hash(r, last->crc);
      http::Response resp = client.execute(r, io, what);
      if (resp.status == 200 || resp.status == 201) {
        if (!last) throw StorageError(StorageError::Kind::kOther, what + ": upload finished before its last chunk");
        return;
      }
      // The session's ifGenerationMatch failed when it completed: another writer published.
      if (last && resp.status == 412) throw http::conflict_error(what, resp.status, "conditionNotMet");
      if (resp.status != 308) fail(what, resp);
      std::uint64_t persisted = 0;  // no Range header: nothing persisted yet
      std::string range = resp.header("range");
      if (std::size_t dash = range.find('-'); range.starts_with("bytes=") && dash != std::string::npos) {
        persisted = std::strtoull(range.c_str() + dash + 1, nullptr, 10) + 1;
      }
      if (persisted >= end && !last) return;
      if (persisted < offset || persisted > end) {
        throw StorageError(StorageError::Kind::kOther, what + ": server reports " + std::to_string(persisted) +
                                                           " bytes persisted, expected " + std::to_string(end));
      }
      at = persisted;  // resend the rest (or, for the last chunk, ask again to finish)
    }
    throw StorageError(StorageError::Kind::kTransient, what + ": the server kept the chunk incomplete");
  }

  // DELETE of the session: the upload is abandoned and nothing is published (GCS answers 499).
  void cancel_session(const std::string& session, std::string_view key) {
    std::string what = "cancel resumable upload of " + describe(key);
    http::Response resp =
        client.execute(request("DELETE", session), IoOptions::with_timeout(std::chrono::seconds(60)), what);
    if (resp.status != 499 && resp.status != 200 && resp.status != 204 && resp.status != 404 && resp.status != 410) {
      fail(what, resp);
    }
  }

  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io, const std::string& what) override {
    const std::string full = object_name(prefix);
    const std::size_t strip = config.prefix.empty() ? 0 : config.prefix.size() + 1;
    std::vector<ObjectInfo> out;
    std::string token;
    for (int page = 0; page < 1000000; ++page) {
      std::string url = bucket_path("") + "?maxResults=" + std::to_string(config.list_page_size);
      if (!full.empty()) url += "&prefix=" + http::uri_encode(full, false);
      if (!token.empty()) url += "&pageToken=" + http::uri_encode(token, false);
      http::Response resp = client.execute(request("GET", url), io, what);
      if (resp.status != 200) fail(what, resp);
      auto j = nlohmann::json::parse(resp.body, nullptr, false);
      if (!j.is_object()) throw StorageError(StorageError::Kind::kOther, what + ": the response is not a JSON object");
      if (auto items = j.find("items"); items != j.end() && items->is_array()) {
        for (const auto& item : *items) {
          std::string name = json_string(item, "name");
          if (name.size() <= strip || name.find(kTempMarker) != std::string::npos) continue;
          out.push_back({name.substr(strip), json_u64(item, "size")});
        }
      }
      token = json_string(j, "nextPageToken");
      if (token.empty()) break;
    }
    return out;
  }

  void remove(std::string_view key, const IoOptions& io, const std::string& what) override {
    http::Response resp = client.execute(request("DELETE", metadata_url(key)), io, what);
    if (resp.status != 204 && resp.status != 200 && resp.status != 404) fail(what, resp);
  }

  std::unique_ptr<StorageWriter> open_writer(const std::string& key, const WriteOptions& options) override;
};

// ---------------------------------------------------------------------------------------
// Writer: http/upload_writer.h with a resumable session. GCS takes a session's chunks in
// order, one at a time: the writer uploads a full chunk then refills its buffer (or, with
// overlap_chunks, fills the next while it uploads); the last names the total and carries
// the CRC-32C of the whole object.

class GcsUpload final : public http::PartUpload {
 public:
  GcsUpload(std::shared_ptr<GcsCore> core, std::string key, bool if_absent)
      : core_(std::move(core)), key_(std::move(key)), if_absent_(if_absent) {}

  void put_whole(const http::PartBody& body, const IoOptions& io) override {
    core_->put_media(key_, body.contiguous(), if_absent_, io, "write");
  }
  void start(const IoOptions& io) override { session_ = core_->start_session(key_, if_absent_, io); }

  // One chunk at a time, in order (parts_in_flight = 1, or no overlap_fill): each waits for
  // the one before, so crc_ extends over the object's bytes in order.
  void put_part(std::size_t index, std::uint64_t offset, const http::PartBody& body, const IoOptions& io) override {
    const ByteSpan data = body.contiguous();
    crc_ = crc32c(crc_, data);
    core_->put_chunk(session_, key_, offset, data, std::nullopt, io);
  }

  void finish(std::size_t parts, std::uint64_t size, const http::PartBody& body, const IoOptions& io) override {
    const ByteSpan tail = body.contiguous();
    const GcsCore::Last last{size, crc32c(crc_, tail)};
    core_->put_chunk(session_, key_, size - tail.size(), tail, last, io);
  }

  void abort() override { core_->cancel_session(session_, key_); }

 private:
  std::shared_ptr<GcsCore> core_;
  std::string key_;
  bool if_absent_ = false;
  std::string session_;    // secret: never printed
  std::uint32_t crc_ = 0;  // CRC-32C of the chunks given to put_part()
};

std::unique_ptr<StorageWriter> GcsCore::open_writer(const std::string& key, const WriteOptions& options) {
  http::UploadLimits limits;
  limits.part_bytes = chunk_bytes;
  limits.parts_in_flight = 1;
  limits.overlap_fill = config.overlap_chunks;
  limits.tail_in_finish = true;
  limits.borrow = false;  // put_chunk() resends a chunk from where the session stopped: one span
  return http::make_upload_writer(
      key, describe(key),
      std::make_shared<GcsUpload>(std::static_pointer_cast<GcsCore>(shared_from_this()), key, options.if_absent), pool,
      limits);
}

}  // namespace

std::unique_ptr<Storage> make_gcs_json_storage(GcsJsonConfig config, const StorageOptions& options) {
  std::string query = config.query;
  return http::make_object_store_storage(std::make_shared<GcsCore>(std::move(config), options), std::move(query));
}

}  // namespace shardpoint::storage::gcs
