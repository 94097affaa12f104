#include "storage/azure/azure_storage.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <random>

#include "core/buffer_pool.h"
#include "shardpoint/error.h"
#include "storage/http/body_checksum.h"
#include "storage/http/http_client.h"
#include "storage/http/object_store.h"
#include "storage/http/ranged_reads.h"
#include "storage/http/upload_writer.h"

namespace shardpoint::storage::azure {
namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;
using Query = std::vector<std::pair<std::string, std::string>>;

[[noreturn]] void bad_url(std::string_view url, std::string_view why) {
  throw UsageError("storage URL \"" + std::string(url) + "\": " + std::string(why) +
                   " (expected az://<container>[/<prefix>] or "
                   "abfs[s]://<container>@<account>.dfs.core.windows.net[/<prefix>])");
}

bool valid_container(std::string_view c) {
  if (c.size() < 3 || c.size() > 63) return false;
  for (std::size_t i = 0; i < c.size(); ++i) {
    char ch = c[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-';
    if (!ok) return false;
    if (ch == '-' && (i == 0 || i + 1 == c.size() || c[i - 1] == '-')) return false;
  }
  return true;
}

bool valid_account(std::string_view a) {
  if (a.size() < 3 || a.size() > 24) return false;
  return std::all_of(a.begin(), a.end(), [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'); });
}

std::string http_date() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

std::string block_id(const std::string& tag, std::size_t index) {
  // Every id of one blob must have the same length: 24 raw bytes -> 32 base64 chars, no '='.
  char raw[25];
  std::snprintf(raw, sizeof raw, "sp%s%014zu", tag.c_str(), index);
  return base64_encode(std::string_view(raw, 24));
}

std::string random_tag() {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device rd;
  std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ (counter.fetch_add(1) * 0x9E3779B97F4A7C15ull);
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(v ^ (v >> 32)));
  return buf;
}

// The driver's shared state and its requests (configuration, location, connections,
// buffers), plugged into http::ObjectStoreStorage. Shared with writers and sources so they
// outlive the Storage.
class AzureClient final : public http::ObjectClient {
 public:
  AzureClient(AzureLocation location, AzureConfig config, std::shared_ptr<BufferPool> pool)
      : location_(std::move(location)),
        config_(std::move(config)),
        pool_(std::move(pool)),
        client_(retry_policy(config_)) {
    std::string endpoint = config_.blob_endpoint;
    if (endpoint.empty()) endpoint = config_.protocol + "://" + config_.account + ".blob." + config_.endpoint_suffix;
    std::size_t scheme_end = endpoint.find("://");
    std::size_t path_start = endpoint.find('/', scheme_end == std::string::npos ? 0 : scheme_end + 3);
    if (path_start == std::string::npos) {
      origin_ = endpoint;
      base_path_ = "";
    } else {
      origin_ = endpoint.substr(0, path_start);
      base_path_ = endpoint.substr(path_start);
    }
  }

  std::string blob_name(std::string_view key) const {
    return location_.prefix.empty() ? std::string(key) : location_.prefix + "/" + std::string(key);
  }
  std::string root_url() const override { return location_.url(); }
  std::string describe(std::string_view key) const override {
    return "azure blob \"" + location_.url() + "/" + std::string(key) + "\"";
  }
  http::SourceLimits source_limits() const override {
    return {config_.source_whole_bytes, config_.source_window_bytes, config_.source_cache_windows};
  }

  struct Call {
    std::string op;    // "read", "stat", ...: the start of error messages
    std::string what;  // `azure blob "..."`
    std::string method;
    std::string blob;  // blob name, or empty for a container request
    Query query;
    Headers headers;
    // The request body: its pieces, sent one after another, and its MD5 when computed as it
    // was appended (http/upload_writer.h); nullptr for none. The caller's, for the call.
    const http::PartBody* body = nullptr;
    std::span<std::byte> into;
    // Statuses that are answers, not errors (returned to the caller): e.g. 404 for remove.
    std::vector<long> accepted;
  };

  struct Result {
    http::Response response;
    int retries = 0;
  };

  // Runs a call, signed afresh for every attempt, with the client's retries. Throws
  // StorageError for failures not accepted. `range`: a ranged GET's range, whose answer the
  // client checks (Request::expect_range). A body goes with its Content-MD5 (the body's own
  // md5, else computed here): Azure refuses a body damaged on the way (400 Md5Mismatch), and
  // the client sends the same pieces again.
  Result run(const Call& given, const IoOptions& io, std::optional<http::ByteRange> range = std::nullopt) {
    Call call = given;
    const bool has_body = call.body != nullptr && call.body->size > 0;
    if (has_body) {
      call.headers.emplace_back(
          "Content-MD5", call.body->md5 ? http::content_md5(*call.body->md5) : http::content_md5(call.body->pieces));
    }
    std::string path = base_path_ + "/" + location_.container;
    if (!call.blob.empty()) path += "/" + uri_encode(call.blob, true);
    std::string url = origin_ + path;
    std::string qs;
    for (const auto& [k, v] : call.query)
      qs += (qs.empty() ? "" : "&") + uri_encode(k, false) + "=" + uri_encode(v, false);
    if (!config_.sas_token.empty() && config_.account_key.empty()) {
      qs += (qs.empty() ? "" : "&") + config_.sas_token;
    }
    if (!qs.empty()) url += "?" + qs;

    http::Request request;
    request.method = call.method;
    request.url = std::move(url);
    request.head = call.method == "HEAD";
    if (has_body) request.body_pieces = call.body->pieces;
    request.body_out = call.into;
    request.use_body_out = !call.into.empty();
    request.expect_range = range;
    request.sign = [&](std::vector<std::string>& out) { out = signed_headers(call, path); };
    if (has_body) request.body_mismatch = &http::azure_body_mismatch;
    Result result;
    result.response = client_.execute(request, io, call.op + " " + call.what);
    result.retries = result.response.retries;
    const http::Response& r = result.response;
    bool ok = r.status >= 200 && r.status < 300;
    if (ok || std::find(call.accepted.begin(), call.accepted.end(), r.status) != call.accepted.end()) return result;
    throw error_for(call, result);
  }

  // The headers of one attempt: the call's, a fresh x-ms-date, and SharedKey over them.
  std::vector<std::string> signed_headers(const Call& call, const std::string& path) const {
    Headers headers = call.headers;
    headers.emplace_back("x-ms-date", http_date());
    headers.emplace_back("x-ms-version", config_.api_version);
    if (call.method == "PUT" && std::none_of(call.headers.begin(), call.headers.end(),
                                             [](const auto& h) { return h.first == "Content-Type"; })) {
      headers.emplace_back("Content-Type", "application/octet-stream");
    }
    if (!config_.account_key.empty()) {
      SignedRequest signed_request{call.method, path, call.query, headers, call.body ? call.body->size : 0};
      headers.emplace_back("Authorization", shared_key_authorization(config_, signed_request));
    }
    std::vector<std::string> out;
    out.reserve(headers.size());
    for (const auto& [k, v] : headers) out.push_back(k + ": " + v);
    return out;
  }

  StorageError error_for(const Call& call, const Result& result) const {
    const http::Response& r = result.response;
    std::string msg = call.op + " " + call.what + ": ";
    // A body refused after every attempt was damaged on the way each time: sending it again
    // later may succeed.
    const StorageError::Kind kind =
        http::azure_body_mismatch(r) ? StorageError::Kind::kTransient : http::error_kind(r.status);
    std::string code = r.header("x-ms-error-code");
    if (code.empty()) code = http::xml_value(r.body, "Code");
    msg += "HTTP " + std::to_string(r.status) + (code.empty() ? "" : " " + code);
    if (http::azure_body_mismatch(r)) msg += " (the body received did not match its Content-MD5)";
    if (kind == StorageError::Kind::kPermission) {
      msg += " (authentication or authorization failed with " + config_.describe() +
             "; check the account key or SAS token and its permissions and expiry)";
    }
    std::string id = r.header("x-ms-request-id");
    if (!id.empty()) msg += " [request id " + id + "]";
    msg += " (" + http::retries_text(result.retries) + ")";
    return StorageError(kind, msg);
  }

  // The shared retry policy with this driver's settings (see AzureConfig).
  static http::RetryPolicy retry_policy(const AzureConfig& config) {
    http::RetryPolicy p;
    p.max_attempts = config.max_attempts;
    p.initial_backoff = config.backoff_base;
    p.max_backoff = config.backoff_max;
    p.jitter_floor = 0.5;
    p.connect_timeout = config.connect_timeout;
    p.low_speed_time = std::chrono::duration_cast<std::chrono::seconds>(config.stall_timeout);
    return p;
  }

  // Get Blob Properties: size and ETag, or nullopt for a missing blob.
  std::optional<Version> head(std::string_view key, const IoOptions& io, const std::string& op) override {
    Call call{op, describe(key), "HEAD", blob_name(key), {}, {}, {}, {}, {404}};
    Result r = run(call, io);
    if (r.response.status == 404) return std::nullopt;
    std::string length = r.response.header("content-length");
    return Version{std::stoull(length.empty() ? "0" : length), r.response.header("etag")};
  }

  [[noreturn]] void throw_not_found(std::string_view op, std::string_view key) const {
    throw StorageError(StorageError::Kind::kNotFound, std::string(op) + " " + describe(key) + ": no such object");
  }

  [[noreturn]] void throw_past_end(std::string_view key, std::uint64_t offset, std::uint64_t length,
                                   std::uint64_t size) const {
    throw FormatError("read " + describe(key) + ": bytes [" + std::to_string(offset) + ", " +
                      std::to_string(offset + length) + ") extend past the end of the object (size " +
                      std::to_string(size) + ", " + std::to_string(offset + length - std::min(size, offset + length)) +
                      " bytes short)");
  }

  // One GET of bytes [0, max_bytes): a shorter blob comes whole (Azurite answers an empty one
  // 206 "bytes 0--1/0"; 416 sends it to the HEAD), the Content-Range (206) or Content-Length
  // (200) gives the size, the ETag the version.
  std::optional<FirstBytes> read_first(std::string_view key, std::size_t max_bytes, const IoOptions& io,
                                       const std::string& op) override {
    std::shared_ptr<std::byte[]> buffer = std::make_shared_for_overwrite<std::byte[]>(max_bytes);
    Call call{op, describe(key), "GET", blob_name(key), {}, {}, {}, std::span(buffer.get(), max_bytes), {404, 416}};
    call.headers.emplace_back("x-ms-range", "bytes=0-" + std::to_string(max_bytes - 1));
    Result r = run(call, io, http::ByteRange{0, max_bytes});
    if (r.response.status == 404) return std::nullopt;
    if (r.response.status == 416) return open_with_head(key, max_bytes, io, op);
    std::optional<std::uint64_t> size = http::object_size_of(r.response);
    if (!size) return open_with_head(key, max_bytes, io, op);
    return FirstBytes{Version{*size, r.response.header("etag")}, std::move(buffer),
                      static_cast<std::size_t>(r.response.bytes_received)};
  }

  // One ranged GET of [offset, offset + out.size()) into out. etag: If-Match (may be empty).
  void get_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const std::string& etag,
                 const IoOptions& io, const std::string& op) {
    Call call{op, describe(key), "GET", blob_name(key), {}, {}, {}, out, {404, 412, 416}};
    call.headers.emplace_back("x-ms-range",
                              "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + out.size() - 1));
    if (!etag.empty()) call.headers.emplace_back("If-Match", etag);
    for (int tries = 0;; ++tries) {
      Result r = run(call, io, http::ByteRange{offset, out.size()});
      long status = r.response.status;
      if (status == 404) {
        if (!etag.empty()) {
          throw StorageError(StorageError::Kind::kNotFound,
                             op + " " + describe(key) + ": the object was removed after it was opened");
        }
        throw_not_found(op, key);
      }
      if (status == 412) {
        throw StorageError(StorageError::Kind::kOther, op + " " + describe(key) +
                                                           ": the object was replaced after it was opened (ETag " +
                                                           etag + " no longer matches)");
      }
      if (status == 416 || r.response.bytes_received < out.size()) {
        std::optional<Version> v = head(key, io, op);
        if (!v) throw_not_found(op, key);
        if (offset + out.size() > v->size) throw_past_end(key, offset, out.size(), v->size);
        // Short body although the object is long enough: a cut connection. Retry a few times.
        if (tries + 1 < config_.max_attempts) continue;
        throw StorageError(StorageError::Kind::kTransient, op + " " + describe(key) + ": short response (" +
                                                               std::to_string(r.response.bytes_received) + " of " +
                                                               std::to_string(out.size()) + " bytes)");
      }
      return;
    }
  }

  // Ranged GETs of read_chunk_bytes, at most `parallelism` at once, pinned to etag when set.
  void read_into(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io,
                 const std::string& op, const std::string& etag) override {
    const std::size_t chunk = std::max<std::size_t>(config_.read_chunk_bytes, 1 << 16);
    http::read_in_parallel(
        offset, out, chunk + 1, chunk, static_cast<int>(config_.parallelism),
        [&](std::uint64_t at, std::span<std::byte> part) { get_range(key, at, part, etag, io, op); });
  }

  // Put Blob publishes the whole blob in one request; a larger one goes through a writer's
  // blocks and block list (also atomic).
  void put(std::string_view key, ByteSpan data, const IoOptions& io, const std::string& op,
           const WriteOptions& options) override {
    if (data.size() <= pool_->buffer_bytes()) {
      put_blob(key, one_piece(data), options.if_absent, io);
      return;
    }
    std::unique_ptr<StorageWriter> writer = open_writer(std::string(key), options);
    writer->append_borrowed(data, io);  // data outlives the writer
    writer->commit(io);
  }

  std::unique_ptr<StorageWriter> open_writer(const std::string& key, const WriteOptions& options) override;

  // if_absent: If-None-Match: *, which Azure refuses with 409 BlobAlreadyExists (412 from
  // some versions) when a blob exists.
  static void make_create_only(Call& call) {
    call.headers.emplace_back("If-None-Match", "*");
    call.accepted = {409, 412};
  }

  void run_create_only(const Call& call, bool if_absent, const IoOptions& io) {
    Result r = run(call, io);
    if (if_absent && (r.response.status == 409 || r.response.status == 412)) {
      std::string code = r.response.header("x-ms-error-code");
      if (code.empty()) code = http::xml_value(r.response.body, "Code");
      if (r.response.status == 409 && code != "BlobAlreadyExists") throw error_for(call, r);
      throw http::conflict_error(call.op + " " + call.what, r.response.status, code);
    }
  }

  // A body of one span, whose Content-MD5 run() computes.
  static http::PartBody one_piece(ByteSpan data) {
    http::PartBody body;
    body.pieces = {data};
    body.size = data.size();
    return body;
  }

  void put_blob(std::string_view key, const http::PartBody& body, bool if_absent, const IoOptions& io) {
    Call call{"write", describe(key), "PUT", blob_name(key), {}, {{"x-ms-blob-type", "BlockBlob"}}, &body, {}, {}};
    if (if_absent) make_create_only(call);
    run_create_only(call, if_absent, io);
  }

  void put_block(std::string_view key, const std::string& id, const http::PartBody& body, const IoOptions& io) {
    Call call{"write", describe(key), "PUT", blob_name(key), {{"comp", "block"}, {"blockid", id}}, {}, &body, {}, {}};
    run(call, io);
  }

  void put_block_list(std::string_view key, const std::vector<std::string>& ids, bool if_absent, const IoOptions& io) {
    std::string xml = "<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>";
    for (const std::string& id : ids) xml += "<Latest>" + id + "</Latest>";
    xml += "</BlockList>";
    const http::PartBody body = one_piece(as_bytes(xml));
    Call call{"commit",
              describe(key),
              "PUT",
              blob_name(key),
              {{"comp", "blocklist"}},
              {{"Content-Type", "application/xml"}},
              &body,
              {},
              {}};
    if (if_absent) make_create_only(call);
    run_create_only(call, if_absent, io);
  }

  void remove(std::string_view key, const IoOptions& io, const std::string& what) override {
    Call call{"remove", describe(key), "DELETE", blob_name(key), {}, {{"x-ms-delete-snapshots", "include"}}, {},
              {},       {404}};
    run(call, io);
  }

  // Every blob under prefix (List Blobs, paged by NextMarker); ObjectStoreStorage sorts.
  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io, const std::string& what) override {
    std::string root = location_.prefix.empty() ? std::string() : location_.prefix + "/";
    std::string full = root + std::string(prefix);
    std::vector<ObjectInfo> out;
    std::string marker;
    // Bounded: a server that keeps returning the same marker cannot loop us forever.
    for (int page = 0; page < 1000000; ++page) {
      Call call{"list", "azure container \"" + location_.url() + "\"", "GET", "", {}, {}, {}, {}, {}};
      call.query = {{"restype", "container"}, {"comp", "list"}, {"maxresults", std::to_string(config_.list_page_size)}};
      if (!full.empty()) call.query.emplace_back("prefix", full);
      if (!marker.empty()) call.query.emplace_back("marker", marker);
      Result r = run(call, io);
      for (std::string_view blob : http::xml_blocks(r.response.body, "Blob")) {
        std::string name = http::xml_value(blob, "Name");
        if (!name.starts_with(root)) continue;
        std::string key = name.substr(root.size());
        if (key.find(kTempMarker) != std::string::npos || key.empty()) continue;
        out.push_back({key, std::strtoull(http::xml_value(blob, "Content-Length").c_str(), nullptr, 10)});
      }
      std::string next_marker = http::xml_value(r.response.body, "NextMarker");
      if (next_marker.empty()) break;
      if (next_marker == marker) {
        throw StorageError(StorageError::Kind::kOther, "list " + location_.url() + ": the service repeated marker");
      }
      marker = next_marker;
    }
    return out;
  }

  void create_container(const IoOptions& io) {
    Call call{"create container",
              "azure container \"" + location_.url() + "\"",
              "PUT",
              "",
              {{"restype", "container"}},
              {},
              {},
              {},
              {409}};
    run(call, io);
  }

 private:
  AzureLocation location_;
  AzureConfig config_;
  std::shared_ptr<BufferPool> pool_;
  std::string origin_;     // "http://127.0.0.1:10000"
  std::string base_path_;  // "/devstoreaccount1" (path-style) or ""
  http::HttpClient client_;
};

// Writer: http/upload_writer.h with Put Block (ids unique per writer, all of one length)
// and Put Block List. Nothing to abort: blocks no list references are invisible and expire.
class AzureUpload final : public http::PartUpload {
 public:
  AzureUpload(std::shared_ptr<AzureClient> client, std::string key, bool if_absent)
      : client_(std::move(client)), key_(std::move(key)), tag_(random_tag()), if_absent_(if_absent) {}

  void put_whole(const http::PartBody& body, const IoOptions& io) override {
    client_->put_blob(key_, body, if_absent_, io);
  }
  void start(const IoOptions& io) override {}
  void put_part(std::size_t index, std::uint64_t offset, const http::PartBody& body, const IoOptions& io) override {
    client_->put_block(key_, block_id(tag_, index), body, io);
  }
  void finish(std::size_t parts, std::uint64_t size, const http::PartBody& tail, const IoOptions& io) override {
    std::vector<std::string> ids;
    ids.reserve(parts);
    for (std::size_t i = 0; i < parts; ++i) ids.push_back(block_id(tag_, i));
    client_->put_block_list(key_, ids, if_absent_, io);
  }
  void abort() override {}

 private:
  std::shared_ptr<AzureClient> client_;
  std::string key_;
  std::string tag_;
  bool if_absent_ = false;
};

std::unique_ptr<StorageWriter> AzureClient::open_writer(const std::string& key, const WriteOptions& options) {
  http::UploadLimits limits;
  limits.part_bytes = pool_->buffer_bytes();
  limits.parts_in_flight = static_cast<int>(std::max<std::size_t>(1, config_.parallelism));
  limits.max_parts = 50000;  // blocks of one block blob
  limits.md5 = true;         // each body's Content-MD5, over its slices as they are appended
  return http::make_upload_writer(
      key, describe(key),
      std::make_shared<AzureUpload>(std::static_pointer_cast<AzureClient>(shared_from_this()), key, options.if_absent),
      pool_, limits);
}

std::shared_ptr<AzureClient> make_client(const Location& where, AzureConfig config, const StorageOptions& options) {
  AzureLocation location = to_azure_location(where);
  const std::string& url = where.text();
  if (!location.account.empty()) {
    if (!config.account.empty() && config.account != location.account) {
      throw UsageError("storage URL \"" + std::string(url) + "\": account \"" + location.account +
                       "\" differs from the credentials' account \"" + config.account + "\"");
    }
    config.account = location.account;
    if (config.blob_endpoint.empty()) config.endpoint_suffix = location.endpoint_suffix;
  }
  if (config.account.empty()) {
    throw UsageError("storage URL \"" + std::string(url) +
                     "\": no Azure account (set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT with "
                     "AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN)");
  }
  if (config.blob_endpoint.empty() && config.protocol != "https" && config.protocol != "http") {
    throw UsageError("Azure DefaultEndpointsProtocol \"" + config.protocol + "\": expected https or http");
  }
  std::shared_ptr<BufferPool> pool = options.buffer_pool;
  if (!pool) {
    pool = std::make_shared<BufferPool>(
        http::upload_pool_options(BufferPoolOptions{}.buffer_bytes, options.default_pool_bytes));
  }
  return std::make_shared<AzureClient>(std::move(location), std::move(config), std::move(pool));
}

}  // namespace

std::string AzureLocation::url() const {
  std::string out = scheme + "://" + container;
  if (scheme != "az") out += "@" + account + ".dfs." + (endpoint_suffix.empty() ? "core.windows.net" : endpoint_suffix);
  if (!prefix.empty()) out += "/" + prefix;
  return out;
}

AzureLocation to_azure_location(const Location& where) {
  const std::string& url = where.text();
  AzureLocation loc;
  if (where.scheme() != Scheme::kAzure && where.scheme() != Scheme::kAbfs && where.scheme() != Scheme::kAbfss) {
    bad_url(url, "unknown scheme \"" + where.scheme_name() + "\"");
  }
  loc.scheme = where.scheme_name();
  const std::string& authority = where.authority();
  if (!where.query().empty() || authority.find('#') != std::string::npos ||
      where.path().find('#') != std::string::npos) {
    bad_url(url, "a query or fragment is not allowed");
  }
  if (where.scheme() == Scheme::kAzure) {
    if (authority.find('@') != std::string::npos) bad_url(url, "az:// URLs take no user or account part");
    loc.container = authority;
  } else {
    const std::size_t at = authority.find('@');
    if (at == std::string::npos) bad_url(url, "abfs URLs need <container>@<account>.dfs.core.windows.net");
    loc.container = authority.substr(0, at);
    const std::string_view host = std::string_view(authority).substr(at + 1);
    const std::size_t dot = host.find('.');
    const std::string_view suffix = dot == std::string_view::npos ? std::string_view() : host.substr(dot + 1);
    if (dot == std::string_view::npos || !(suffix.starts_with("dfs.") || suffix.starts_with("blob."))) {
      bad_url(url, "host \"" + std::string(host) + "\" is not <account>.dfs.core.windows.net");
    }
    loc.account = std::string(host.substr(0, dot));
    loc.endpoint_suffix = std::string(suffix.substr(suffix.find('.') + 1));
    if (loc.endpoint_suffix.empty()) bad_url(url, "host \"" + std::string(host) + "\" has no domain after dfs.");
    if (!valid_account(loc.account)) bad_url(url, "invalid account name \"" + loc.account + "\"");
  }
  if (!valid_container(loc.container)) {
    bad_url(url,
            "invalid container name \"" + loc.container + "\" (3-63 lower-case letters, digits and single hyphens)");
  }
  const std::string& path = where.path();
  bool bad_prefix = where.dropped_segments();
  if (!path.empty() && !bad_prefix) {
    try {
      validate_key(path);
    } catch (const UsageError&) {
      bad_prefix = true;
    }
  }
  if (bad_prefix) bad_url(url, "invalid prefix (empty, \".\" or \"..\" segments)");
  loc.prefix = path;
  return loc;
}

std::unique_ptr<Storage> open_azure_storage_with(const Location& url, const AzureConfig& config,
                                                 const StorageOptions& options) {
  return http::make_object_store_storage(make_client(url, config, options), "");
}

std::unique_ptr<Storage> open_azure_storage(const Location& url, const StorageOptions& options) {
  return open_azure_storage_with(url, azure_config_from_env(), options);
}

void create_azure_container(const Location& url, const AzureConfig& config) {
  StorageOptions options;
  options.default_pool_bytes = std::size_t{8} << 20;
  make_client(url, config, options)->create_container({});
}

namespace {
const StorageRegistration kAzureRegistration{"az", &open_azure_storage};     // az://container/prefix
const StorageRegistration kAbfsRegistration{"abfs", &open_azure_storage};    // abfs://c@acct.dfs.core.windows.net/p
const StorageRegistration kAbfssRegistration{"abfss", &open_azure_storage};  // abfss://c@acct.dfs.core.windows.net/p
}  // namespace

}  // namespace shardpoint::storage::azure
