#include "storage/s3/s3_storage.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/buffer_pool.h"
#include "core/checksum.h"
#include "shardpoint/error.h"
#include "shardpoint/mutex.h"
#include "storage/http/body_checksum.h"
#include "storage/http/http_client.h"
#include "storage/http/object_store.h"
#include "storage/http/ranged_reads.h"
#include "storage/http/upload_writer.h"

namespace shardpoint::storage::s3 {
namespace {

constexpr std::size_t kMinPartBytes = std::size_t{5} << 20;
constexpr std::size_t kMaxParts = 10000;  // parts of one multipart upload
constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string sha256_hex(ByteSpan data) {
  if (data.empty()) return kEmptySha256;
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

// ---------------------------------------------------------------------------------------
// Minimal XML: S3's responses are flat enough to read by tag.

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

using http::retries_text;
using http::xml_blocks;
using http::xml_value;

// ---------------------------------------------------------------------------------------
// The shared state of a storage, its writers and sources.

struct S3Core final : http::ObjectClient {
  S3Config config;
  http::HttpClient client;
  std::shared_ptr<BufferPool> pool;
  std::size_t part_bytes = 0;

  S3Core(S3Config c, const StorageOptions& options) : config(std::move(c)), client(config.retry) {
    std::size_t wanted = config.part_bytes;
    std::shared_ptr<BufferPool> given = options.buffer_pool;
    if (wanted == 0) wanted = given ? given->buffer_bytes() : std::size_t{8} << 20;
    wanted = std::max(wanted, kMinPartBytes);
    if (given && given->buffer_bytes() >= wanted) {
      pool = given;
    } else {
      // Every part a writer keeps in flight plus the one it fills (more when the caller's
      // default_pool_bytes allows).
      pool = std::make_shared<BufferPool>(http::upload_pool_options(
          wanted,
          std::max(options.default_pool_bytes, wanted * static_cast<std::size_t>(config.max_parallel_parts + 1))));
    }
    part_bytes = pool->buffer_bytes();
  }

  std::string object_name(std::string_view key) const {
    return config.prefix.empty() ? std::string(key) : config.prefix + "/" + std::string(key);
  }
  std::string root_url() const override {
    return config.scheme + "://" + config.bucket + (config.prefix.empty() ? "" : "/" + config.prefix);
  }
  std::string describe(std::string_view key) const override {
    return config.service + " object \"" + root_url() + "/" + std::string(key) + "\"";
  }
  http::SourceLimits source_limits() const override {
    return {config.source_whole_bytes, config.source_window_bytes, config.source_cache_windows};
  }

  // https://host/bucket (path style) or https://bucket.host (virtual host).
  std::string bucket_url() const {
    if (config.path_style) return config.endpoint + "/" + config.bucket;
    std::size_t scheme_end = config.endpoint.find("://");
    std::size_t host = scheme_end == std::string::npos ? 0 : scheme_end + 3;
    return config.endpoint.substr(0, host) + config.bucket + "." + config.endpoint.substr(host);
  }
  std::string object_url(std::string_view key, const std::string& query = "") const {
    return bucket_url() + "/" + http::uri_encode(object_name(key), /*keep_slash=*/true) +
           (query.empty() ? "" : "?" + query);
  }

  // crc_covered: the caller adds the body's x-amz-checksum-crc32c (add_crc32c), which then
  // stands in for its signed SHA-256 where sends_unsigned_payload() allows.
  http::Request request(std::string method, std::string url, ByteSpan body = {}, bool crc_covered = false) const {
    http::Request r =
        request_of(std::move(method), std::move(url), body.size(), crc_covered, [&] { return sha256_hex(body); });
    r.body = body;
    if (!body.empty() && config.content_md5) r.headers.push_back("Content-MD5: " + http::content_md5(body));
    return r;
  }

  // A PutObject or UploadPart of a writer's part: its pieces are sent as they are, with the
  // digests the writer computed as it appended them (open_writer's UploadLimits).
  http::Request request(std::string method, std::string url, const http::PartBody& body) const {
    http::Request r = request_of(std::move(method), std::move(url), body.size, /*crc_covered=*/true, [&] {
      if (body.size == 0) return std::string(kEmptySha256);
      if (!body.sha256_hex.empty()) return body.sha256_hex;
      Sha256 h;
      for (ByteSpan piece : body.pieces) h.update(piece);
      return h.hex_digest();
    });
    r.body_pieces = body.pieces;
    if (body.size > 0 && config.content_md5)
      r.headers.push_back("Content-MD5: " + http::content_md5(body.contiguous()));
    return r;
  }

  // The headers every request has; sha256_of() gives the body's hex SHA-256 when it is signed.
  template <typename Sha256Of>
  http::Request request_of(std::string method, std::string url, std::uint64_t body_size, bool crc_covered,
                           const Sha256Of& sha256_of) const {
    http::Request r;
    r.method = std::move(method);
    r.url = std::move(url);
    const bool unsigned_body = crc_covered && sends_unsigned_payload(config);
    r.headers.push_back("x-amz-content-sha256: " + (unsigned_body ? std::string("UNSIGNED-PAYLOAD") : sha256_of()));
    if (body_size > 0) r.body_mismatch = &http::s3_body_mismatch;
    if (!config.credentials.empty()) {
      r.aws_sigv4 = config.sigv4_provider + ":" + config.region + ":s3";
      r.userpwd = config.credentials.access_key_id + ":" + config.credentials.secret_access_key;
      if (!config.credentials.session_token.empty()) {
        r.headers.push_back("x-amz-security-token: " + config.credentials.session_token);
      }
    }
    if (r.method == "PUT" || r.method == "POST") r.headers.push_back("Content-Type: application/octet-stream");
    return r;
  }

  http::Response execute(const http::Request& r, const IoOptions& io, const std::string& what) {
    return client.execute(r, io, what);
  }

  [[noreturn]] void fail(const std::string& what, const http::Response& r) const {
    std::string code = xml_value(r.body, "Code");
    std::string message = xml_value(r.body, "Message");
    // A body refused after every attempt was damaged on the way each time: sending it again
    // later may succeed.
    const StorageError::Kind kind =
        http::s3_body_mismatch(r) ? StorageError::Kind::kTransient : http::error_kind(r.status);
    std::string text = what + ": HTTP " + std::to_string(r.status);
    if (!code.empty()) text += " " + code;
    if (!message.empty()) text += ": " + message;
    if (r.status == 404 && code.empty()) text += " (no such object)";
    if (kind == StorageError::Kind::kPermission) {
      text += config.credentials.empty()
                  ? " (no credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
                  : " (credentials from " + config.credentials.source + ")";
    }
    text += " (request id " + (r.request_id.empty() ? std::string("none") : r.request_id) + ", " +
            retries_text(r.retries) + ")";
    throw StorageError(kind, text);
  }

  // HEAD: size and ETag; nullopt for 404.
  std::optional<Version> head(std::string_view key, const IoOptions& io, const std::string& op) override {
    http::Request r = request("HEAD", object_url(key));
    r.head = true;
    std::string what = op + " " + describe(key);
    http::Response resp = execute(r, io, what);
    if (resp.status == 404) return std::nullopt;
    if (resp.status != 200) fail(what, resp);
    std::string length = resp.header("content-length");
    return Version{static_cast<std::uint64_t>(std::strtoull(length.c_str(), nullptr, 10)), resp.header("etag")};
  }

  // One ranged GET into out. Returns the response's ETag. Past-the-end ranges are FormatError.
  std::string get_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io,
                        const std::string& op) {
    http::Request r = request("GET", object_url(key));
    r.headers.push_back("Range: bytes=" + std::to_string(offset) + "-" + std::to_string(offset + out.size() - 1));
    r.body_out = out;
    r.use_body_out = true;
    r.expect_range = http::ByteRange{offset, out.size()};
    std::string what = op + " " + describe(key);
    http::Response resp = execute(r, io, what);
    if (resp.status == 416 || ((resp.status == 206 || resp.status == 200) && resp.bytes_received < out.size())) {
      throw FormatError(what + ": range [" + std::to_string(offset) + ", " + std::to_string(offset + out.size()) +
                        ") extends past the end of the object (got " + std::to_string(resp.bytes_received) + " of " +
                        std::to_string(out.size()) + " bytes)");
    }
    if (resp.status == 200 && offset != 0) {
      throw StorageError(StorageError::Kind::kOther, what + ": server ignored the Range header");
    }
    if (resp.status != 206 && resp.status != 200) fail(what, resp);
    return resp.header("etag");
  }

  // One GET of bytes [0, max_bytes): a shorter object comes whole, and the answer's
  // Content-Range (206) or Content-Length (200, a server that sends the whole object) gives
  // its size, its ETag the version. An empty object answers 416 to any range: then the HEAD.
  std::optional<FirstBytes> read_first(std::string_view key, std::size_t max_bytes, const IoOptions& io,
                                       const std::string& op) override {
    std::shared_ptr<std::byte[]> buffer = std::make_shared_for_overwrite<std::byte[]>(max_bytes);
    const std::span<std::byte> out(buffer.get(), max_bytes);
    http::Request r = request("GET", object_url(key));
    r.headers.push_back("Range: bytes=0-" + std::to_string(out.size() - 1));
    r.body_out = out;
    r.use_body_out = true;
    r.expect_range = http::ByteRange{0, out.size()};
    std::string what = op + " " + describe(key);
    http::Response resp = execute(r, io, what);
    if (resp.status == 404) return std::nullopt;
    if (resp.status == 416) return open_with_head(key, max_bytes, io, op);
    if (resp.status != 206 && resp.status != 200) fail(what, resp);
    std::optional<std::uint64_t> size = http::object_size_of(resp);
    if (!size) return open_with_head(key, max_bytes, io, op);  // "bytes 0-9/*": size unknown
    return FirstBytes{Version{*size, resp.header("etag")}, std::move(buffer),
                      static_cast<std::size_t>(resp.bytes_received)};
  }

  // Ranged GETs of out in parallel chunks when it is large. All ETags must agree with
  // `etag` when it is not empty.
  void read_into(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io,
                 const std::string& op, const std::string& etag) override {
    auto check_etag = [&](const std::string& got) {
      if (!etag.empty() && !got.empty() && got != etag) {
        throw StorageError(
            StorageError::Kind::kOther,
            op + " " + describe(key) + ": the object changed since it was opened (ETag " + etag + ", now " + got + ")");
      }
    };
    http::read_in_parallel(
        offset, out, config.parallel_read_bytes, config.read_chunk_bytes, config.read_threads,
        [&](std::uint64_t at, std::span<std::byte> part) { check_etag(get_range(key, at, part, io, op)); });
  }

  // Objects larger than a part go up in parts (S3 takes at most 5 GiB in one PUT; parts
  // also upload in parallel).
  void put(std::string_view key, ByteSpan data, const IoOptions& io, const std::string& op,
           const WriteOptions& options) override {
    if (data.size() > part_bytes) {
      std::unique_ptr<StorageWriter> writer = open_writer(std::string(key), options);
      writer->append_borrowed(data, io);  // data outlives the writer
      writer->commit(io);
      return;
    }
    put_object(key, data, io, op, options.if_absent);
  }

  // PutObject; create-only (If-None-Match: * or the service's equivalent) when if_absent.
  void put_object(std::string_view key, ByteSpan data, const IoOptions& io, const std::string& op, bool if_absent) {
    http::PartBody body;
    body.pieces = {data};
    body.size = data.size();
    put_object(key, body, io, op, if_absent);
  }
  void put_object(std::string_view key, const http::PartBody& body, const IoOptions& io, const std::string& op,
                  bool if_absent) {
    std::string what = op + " " + describe(key);
    http::Request r = request("PUT", object_url(key), body);
    add_crc32c(r, body);
    if (if_absent) r.headers.push_back(config.create_only_header);
    http::Response resp = execute(r, io, what);
    if (if_absent && resp.status == 412) throw http::conflict_error(what, resp.status, xml_value(resp.body, "Code"));
    if (resp.status != 200) fail(what, resp);
  }

  // x-amz-checksum-crc32c of body when config.checksum_crc32c (S3 refuses a body that does
  // not match it: 400 BadDigest, which the client retries). Returns the value ("" when off).
  std::string add_crc32c(http::Request& r, const http::PartBody& body) const {
    if (!config.checksum_crc32c) return "";
    std::uint32_t crc = 0;
    if (body.crc32c) {
      crc = *body.crc32c;
    } else {
      for (ByteSpan piece : body.pieces) crc = crc32c(crc, piece);
    }
    std::string value = http::crc32c_base64(crc);
    r.headers.push_back("x-amz-checksum-crc32c: " + value);
    r.headers.push_back("x-amz-sdk-checksum-algorithm: CRC32C");
    return value;
  }

  std::string create_multipart(std::string_view key, const IoOptions& io) {
    std::string what = "start multipart upload of " + describe(key);
    http::Request r = request("POST", object_url(key, "uploads="));
    if (config.checksum_crc32c) r.headers.push_back("x-amz-checksum-algorithm: CRC32C");
    http::Response resp = execute(r, io, what);
    if (resp.status != 200) fail(what, resp);
    std::string id = xml_value(resp.body, "UploadId");
    if (id.empty()) throw StorageError(StorageError::Kind::kOther, what + ": response has no UploadId");
    return id;
  }

  // What CompleteMultipartUpload needs of an uploaded part.
  struct UploadedPart {
    std::string etag;
    std::string crc32c;  // base64, when config.checksum_crc32c
  };

  UploadedPart upload_part(std::string_view key, const std::string& upload_id, int part, const http::PartBody& body,
                           const IoOptions& io) {
    std::string what =
        "upload part " + std::to_string(part) + " (" + std::to_string(body.size) + " bytes) of " + describe(key);
    std::string query = "partNumber=" + std::to_string(part) + "&uploadId=" + http::uri_encode(upload_id, false);
    http::Request r = request("PUT", object_url(key, query), body);
    std::string crc = add_crc32c(r, body);
    http::Response resp = execute(r, io, what);
    if (resp.status != 200) fail(what, resp);
    std::string etag = resp.header("etag");
    if (etag.empty()) throw StorageError(StorageError::Kind::kOther, what + ": response has no ETag");
    return {etag, std::move(crc)};
  }

  void complete_multipart(std::string_view key, const std::string& upload_id, const std::map<int, UploadedPart>& parts,
                          bool if_absent, const IoOptions& io) {
    std::string xml = "<CompleteMultipartUpload>";
    std::map<int, std::string> etags;
    for (const auto& [number, part] : parts) {
      xml += "<Part><PartNumber>" + std::to_string(number) + "</PartNumber><ETag>" + xml_escape(part.etag) + "</ETag>";
      // An upload created with a checksum algorithm must name each part's checksum.
      if (!part.crc32c.empty()) xml += "<ChecksumCRC32C>" + part.crc32c + "</ChecksumCRC32C>";
      xml += "</Part>";
      etags[number] = part.etag;
    }
    xml += "</CompleteMultipartUpload>";
    std::string what = "complete multipart upload of " + describe(key);
    http::Request r = request("POST", object_url(key, "uploadId=" + http::uri_encode(upload_id, false)), as_bytes(xml));
    if (if_absent) r.headers.push_back(config.create_only_header);
    http::Response resp = execute(r, io, what);
    // An earlier attempt whose answer was lost may have completed the upload: the retry (ours,
    // or libcurl's own resend on a fresh connection) then finds no upload, or (create-only)
    // the object it made. The object is ours when its ETag is the one S3 gives a multipart
    // object of exactly these parts.
    const bool maybe_ours = (resp.status == 404 && resp.body.find("NoSuchUpload") != std::string::npos) ||
                            (if_absent && resp.status == 412);
    if (maybe_ours) {
      std::optional<Version> now = head(key, io, "check the completion of");
      const bool ours = now && unquoted(now->tag) == multipart_etag(etags);
      // A 412 leaves this upload open (the object is another upload's, or another's
      // identical bytes): abort it, as a refused writer's would be.
      if (resp.status == 412 && ours) abort_multipart(object_name(key), upload_id, io);
      if (ours) return;
      if (resp.status == 412) throw http::conflict_error(what, resp.status, xml_value(resp.body, "Code"));
    }
    // S3 may answer 200 and put the error in the body.
    if (resp.status != 200 || resp.body.find("<Error>") != std::string::npos) {
      if (resp.status == 200) resp.status = 500;
      fail(what, resp);
    }
  }

  static std::string unquoted(const std::string& etag) {
    if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') return etag.substr(1, etag.size() - 2);
    return etag;
  }

  // The ETag S3 gives an object completed from these parts: the MD5 of the concatenated
  // binary MD5s of the parts (their ETags), "-", the part count. Empty when a part's ETag
  // is not an MD5 (then nothing matches it).
  static std::string multipart_etag(const std::map<int, std::string>& etags) {
    std::string digests;
    for (const auto& [part, etag] : etags) {
      const std::string hex = unquoted(etag);
      if (hex.size() != 32) return "";
      for (std::size_t i = 0; i < hex.size(); i += 2) {
        unsigned v = 0;
        const auto [end, ec] = std::from_chars(hex.data() + i, hex.data() + i + 2, v, 16);
        if (ec != std::errc() || end != hex.data() + i + 2) return "";
        digests += static_cast<char>(v);
      }
    }
    return md5_hex(as_bytes(digests)) + "-" + std::to_string(etags.size());
  }

  void abort_multipart(const std::string& object, const std::string& upload_id, const IoOptions& io) {
    std::string url =
        bucket_url() + "/" + http::uri_encode(object, true) + "?uploadId=" + http::uri_encode(upload_id, false);
    std::string what = "abort multipart upload of " + config.service + " object \"" + config.scheme + "://" +
                       config.bucket + "/" + object + "\"";
    http::Response resp = execute(request("DELETE", url), io, what);
    if (resp.status != 204 && resp.status != 200 && resp.status != 404) fail(what, resp);
  }

  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io, const std::string& what) override {
    const std::string full = object_name(prefix);
    const std::size_t strip = config.prefix.empty() ? 0 : config.prefix.size() + 1;
    std::vector<ObjectInfo> out;
    std::string token;
    for (int page = 0; page < 1000000; ++page) {
      // Query parameters sorted by name: libcurl 7.88 signs the query as given.
      std::string query;
      if (!token.empty()) query += "continuation-token=" + http::uri_encode(token, false) + "&";
      query += "list-type=2";
      if (!full.empty()) query += "&prefix=" + http::uri_encode(full, false);
      http::Response resp = execute(request("GET", bucket_url() + "?" + query), io, what);
      if (resp.status != 200) fail(what, resp);
      for (std::string_view contents : xml_blocks(resp.body, "Contents")) {
        std::string key = xml_value(contents, "Key");
        if (key.size() <= strip || key.find(kTempMarker) != std::string::npos) continue;
        out.push_back({key.substr(strip), std::strtoull(xml_value(contents, "Size").c_str(), nullptr, 10)});
      }
      if (xml_value(resp.body, "IsTruncated") != "true") break;
      token = xml_value(resp.body, "NextContinuationToken");
      if (token.empty()) break;
    }
    return out;
  }

  void remove(std::string_view key, const IoOptions& io, const std::string& what) override {
    http::Response resp = execute(request("DELETE", object_url(key)), io, what);
    if (resp.status != 204 && resp.status != 200 && resp.status != 404) fail(what, resp);
  }

  std::unique_ptr<StorageWriter> open_writer(const std::string& key, const WriteOptions& options) override;

  // The leftovers of writers that died: unfinished multipart uploads under prefix. A server
  // that cannot list uploads (501 NotImplemented: s3s-fs) leaves them to its own cleanup.
  void remove_leftovers(std::string_view prefix, const IoOptions& io) override {
    const std::string full = object_name(prefix);
    std::string what = "list multipart uploads under " + root_url() + "/" + std::string(prefix);
    std::string query = full.empty() ? "uploads=" : "prefix=" + http::uri_encode(full, false) + "&uploads=";
    http::Response resp = execute(request("GET", bucket_url() + "?" + query), io, what);
    if (resp.status == 501) return;
    if (resp.status != 200) fail(what, resp);
    for (std::string_view upload : xml_blocks(resp.body, "Upload")) {
      std::string key = xml_value(upload, "Key");
      std::string id = xml_value(upload, "UploadId");
      if (!key.starts_with(full) || id.empty()) continue;
      abort_multipart(key, id, io);
    }
  }
};

// ---------------------------------------------------------------------------------------
// Writer: http/upload_writer.h with S3's multipart upload (part numbers start at 1).

class S3Upload final : public http::PartUpload {
 public:
  S3Upload(std::shared_ptr<S3Core> core, std::string key, bool if_absent)
      : core_(std::move(core)), key_(std::move(key)), if_absent_(if_absent) {}

  void put_whole(const http::PartBody& body, const IoOptions& io) override {
    core_->put_object(key_, body, io, "write", if_absent_);
  }
  void start(const IoOptions& io) override { upload_id_ = core_->create_multipart(key_, io); }

  void put_part(std::size_t index, std::uint64_t offset, const http::PartBody& body, const IoOptions& io) override {
    const int part = static_cast<int>(index) + 1;
    S3Core::UploadedPart uploaded = core_->upload_part(key_, upload_id_, part, body, io);
    MutexLock lock(parts_mu_);
    parts_[part] = std::move(uploaded);
  }

  void finish(std::size_t parts, std::uint64_t size, const http::PartBody& tail, const IoOptions& io) override {
    MutexLock lock(parts_mu_);
    core_->complete_multipart(key_, upload_id_, parts_, if_absent_, io);
  }

  void abort() override {
    core_->abort_multipart(core_->object_name(key_), upload_id_, IoOptions::with_timeout(std::chrono::seconds(60)));
  }

 private:
  std::shared_ptr<S3Core> core_;
  std::string key_;
  bool if_absent_ = false;
  std::string upload_id_;
  Mutex parts_mu_;
  std::map<int, S3Core::UploadedPart> parts_ SP_GUARDED_BY(parts_mu_);
};

std::unique_ptr<StorageWriter> S3Core::open_writer(const std::string& key, const WriteOptions& options) {
  http::UploadLimits limits;
  limits.part_bytes = part_bytes;
  limits.parts_in_flight = config.max_parallel_parts;
  limits.max_parts = kMaxParts;
  // Content-MD5 (GCS's XML API) is taken over one span: those bodies are copied whole.
  limits.borrow = !config.content_md5;
  limits.sha256 = !sends_unsigned_payload(config);
  limits.crc32c = config.checksum_crc32c;
  return http::make_upload_writer(
      key, describe(key),
      std::make_shared<S3Upload>(std::static_pointer_cast<S3Core>(shared_from_this()), key, options.if_absent), pool,
      limits);
}

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0) throw UsageError(std::string(name) + "=\"" + v + "\": expected a non-negative integer");
  return x;
}

bool valid_prefix_segment(std::string_view seg) { return !seg.empty() && seg != "." && seg != ".."; }

}  // namespace

void validate_bucket_name(std::string_view bucket, std::string_view url, bool gcs_rules) {
  auto bad = [&](const std::string& why) {
    throw UsageError("storage URL \"" + std::string(url) + "\": invalid bucket name \"" + std::string(bucket) +
                     "\": " + why);
  };
  const std::size_t max = gcs_rules && bucket.find('.') != std::string_view::npos ? 222 : 63;
  if (bucket.size() < 3 || bucket.size() > max) bad("must be 3 to " + std::to_string(max) + " characters");
  for (char c : bucket) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || (gcs_rules && c == '_');
    if (!ok) bad(std::string("character '") + c + "' (allowed: a-z 0-9 . -" + (gcs_rules ? " _" : "") + ")");
  }
  if (!std::isalnum(static_cast<unsigned char>(bucket.front())) ||
      !std::isalnum(static_cast<unsigned char>(bucket.back()))) {
    bad("must start and end with a letter or digit");
  }
}

std::vector<std::pair<std::string, std::string>> use_bucket_location(const Location& location, Scheme scheme,
                                                                     S3Config& config, bool gcs_rules) {
  const std::string& url = location.text();
  if (location.scheme() != scheme) {
    throw UsageError("storage URL \"" + url + "\": expected " + (scheme == Scheme::kGcs ? "gs" : "s3") +
                     "://BUCKET[/PREFIX]");
  }
  for (const std::string* part : {&location.authority(), &location.path(), &location.query()}) {
    if (part->find('#') != std::string::npos) {
      throw UsageError("storage URL \"" + url + "\": a fragment ('#') is not allowed");
    }
  }
  validate_bucket_name(location.authority(), url, gcs_rules);
  if (location.dropped_segments()) {
    throw UsageError("storage URL \"" + url +
                     "\": invalid path segment in the prefix (empty, \".\" and \"..\" are not allowed)");
  }
  const std::string_view prefix = location.path();
  std::size_t start = 0;
  while (!prefix.empty()) {
    const std::size_t end = prefix.find('/', start);
    const std::string_view seg = prefix.substr(start, end == std::string_view::npos ? end : end - start);
    if (!valid_prefix_segment(seg) || seg.find(kTempMarker) != std::string_view::npos) {
      throw UsageError("storage URL \"" + url + "\": invalid path segment \"" + std::string(seg) +
                       "\" in the prefix (empty, \".\" and \"..\" are not allowed)");
    }
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  config.scheme = location.scheme_name();
  config.bucket = location.authority();
  config.prefix = location.path();
  config.query = location.query().empty() ? std::string() : location.query().substr(1);
  return location.query_options();
}

bool sends_unsigned_payload(const S3Config& config) {
  using Signing = S3Config::PayloadSigning;
  if (!config.checksum_crc32c || config.payload_signing == Signing::kSigned) return false;
  return config.payload_signing == Signing::kUnsigned || config.endpoint.starts_with("https://");
}

void apply_tuning_environment(S3Config& config) {
  config.retry.max_attempts = static_cast<int>(env_long("SHARDPOINT_HTTP_MAX_ATTEMPTS", config.retry.max_attempts));
  config.retry.initial_backoff =
      std::chrono::milliseconds(env_long("SHARDPOINT_HTTP_BACKOFF_MS", config.retry.initial_backoff.count()));
  long in_flight = env_long("SHARDPOINT_S3_PARTS_IN_FLIGHT", 0);
  if (in_flight > 0) config.max_parallel_parts = static_cast<int>(std::min(in_flight, 64L));
  long part_mb = env_long("SHARDPOINT_S3_PART_MB", 0);
  if (part_mb > 0) config.part_bytes = static_cast<std::size_t>(part_mb) << 20;
  if (const char* v = std::getenv("SHARDPOINT_S3_PAYLOAD"); v != nullptr && *v != '\0') {
    const std::string_view payload = v;
    if (payload == "auto") {
      config.payload_signing = S3Config::PayloadSigning::kAuto;
    } else if (payload == "signed") {
      config.payload_signing = S3Config::PayloadSigning::kSigned;
    } else if (payload == "unsigned") {
      config.payload_signing = S3Config::PayloadSigning::kUnsigned;
    } else {
      throw UsageError("SHARDPOINT_S3_PAYLOAD=\"" + std::string(payload) + "\": expected auto, signed or unsigned");
    }
  }
}

S3Config s3_config(const Location& location) {
  S3Config config;
  auto pairs = use_bucket_location(location, Scheme::kS3, config, /*gcs_rules=*/false);
  const std::string& url = location.text();
  std::string region, endpoint, addressing, profile;
  for (const auto& [k, v] : pairs) {
    if (k == "region") region = v;
    else if (k == "endpoint") endpoint = v;
    else if (k == "addressing") addressing = v;
    else if (k == "profile") profile = v;
    else {
      throw UsageError("storage URL \"" + std::string(url) + "\": unknown query key \"" + k +
                       "\" (accepted: region, endpoint, addressing, profile)");
    }
  }
  if (region.empty()) region = load_aws_region(profile);
  if (region.empty()) region = "us-east-1";
  if (endpoint.empty()) endpoint = load_aws_endpoint(profile);
  bool custom = !endpoint.empty();
  if (!custom) endpoint = "https://s3." + region + ".amazonaws.com";
  while (endpoint.ends_with('/')) endpoint.pop_back();
  if (!endpoint.starts_with("http://") && !endpoint.starts_with("https://")) {
    throw UsageError("storage URL \"" + std::string(url) + "\": endpoint \"" + endpoint +
                     "\" must start with http:// or https://");
  }
  if (addressing.empty()) {
    config.path_style = custom;
  } else if (addressing == "path" || addressing == "virtual") {
    config.path_style = addressing == "path";
  } else {
    throw UsageError("storage URL \"" + std::string(url) + "\": addressing=\"" + addressing +
                     "\" (accepted: path, virtual)");
  }
  if (!config.path_style && config.bucket.find('.') != std::string::npos && endpoint.starts_with("https://")) {
    config.path_style = true;  // a dotted bucket breaks the TLS wildcard of virtual hosts
  }
  config.region = region;
  config.endpoint = endpoint;
  config.credentials = load_aws_credentials(profile);
  apply_tuning_environment(config);
  return config;
}

std::unique_ptr<Storage> make_s3_storage(S3Config config, const StorageOptions& options) {
  std::string query = config.query;
  return http::make_object_store_storage(std::make_shared<S3Core>(std::move(config), options), std::move(query));
}

std::unique_ptr<Storage> open_s3_storage(const Location& location, const StorageOptions& options) {
  return make_s3_storage(s3_config(location), options);
}

namespace {
const StorageRegistration kS3Registration{"s3", &open_s3_storage};  // s3://bucket/prefix
}  // namespace

}  // namespace shardpoint::storage::s3
