#include "storage/http/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "shardpoint/error.h"
#include "shardpoint/mutex.h"
#include "storage/http/retry_stats.h"

namespace shardpoint::storage::http {
namespace {

constexpr std::size_t kMaxBody = std::size_t{64} << 20;  // error documents, listings
constexpr std::size_t kMaxIdle = 64;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  const Request* request = nullptr;
  Response* response = nullptr;
  // The body: request->body_pieces, or request->body as the one piece.
  std::span<const ByteSpan> pieces;
  std::uint64_t body_bytes = 0;
  std::uint64_t sent = 0;
  std::size_t piece = 0;         // the piece the next byte comes from
  std::size_t piece_offset = 0;  // and its offset in that piece
  bool overflow = false;         // a 2xx body larger than body_out
  bool body_cap = false;         // another body larger than kMaxBody
  const IoOptions* io = nullptr;
  CURL* curl = nullptr;
};

std::size_t on_write(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::size_t bytes = size * n;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  // Error documents go to Response::body, never into the caller's buffer.
  if (t->request->use_body_out && status >= 200 && status < 300) {
    std::span<std::byte> out = t->request->body_out;
    if (t->response->bytes_received + bytes > out.size()) {
      t->overflow = true;
      return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
    }
    std::memcpy(out.data() + t->response->bytes_received, data, bytes);
  } else {
    if (t->response->body.size() + bytes > kMaxBody) {
      t->body_cap = true;
      return 0;
    }
    t->response->body.append(data, bytes);
  }
  t->response->bytes_received += bytes;
  return bytes;
}

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::size_t bytes = size * n;
  std::string_view line(data, bytes);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.remove_suffix(1);
  if (line.starts_with("HTTP/")) {
    t->response->headers.clear();  // a new status line (after 100 Continue, redirects)
    return bytes;
  }
  std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return bytes;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  t->response->headers[name] = std::string(value);
  return bytes;
}

// Fills libcurl's buffer from the body's pieces, one after another.
std::size_t on_read(char* buffer, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t room = size * n;
  std::size_t bytes = 0;
  while (bytes < room && t->piece < t->pieces.size()) {
    const ByteSpan piece = t->pieces[t->piece];
    const std::size_t take = std::min(room - bytes, piece.size() - t->piece_offset);
    if (take > 0) std::memcpy(buffer + bytes, piece.data() + t->piece_offset, take);
    bytes += take;
    t->piece_offset += take;
    if (t->piece_offset == piece.size()) {
      ++t->piece;
      t->piece_offset = 0;
    }
  }
  t->sent += bytes;
  return bytes;
}

// Rewinds the body (libcurl resends it after a redirect or a closed kept-alive connection).
int on_seek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<std::uint64_t>(offset) > t->body_bytes) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  std::uint64_t left = static_cast<std::uint64_t>(offset);
  t->sent = left;
  t->piece = 0;
  while (t->piece < t->pieces.size() && left >= t->pieces[t->piece].size()) {
    left -= t->pieces[t->piece].size();
    ++t->piece;
  }
  t->piece_offset = static_cast<std::size_t>(left);
  return CURL_SEEKFUNC_OK;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  return io_expired(*t->io) ? 1 : 0;
}

// Why a transport failure is worth another attempt; nullopt when it is not (a bad URL, a
// TLS certificate problem). `url` tells a junk answer ("Received HTTP/0.9", reported as an
// unsupported protocol) from a URL whose scheme libcurl refuses.
std::optional<RetryCause> transport_cause(CURLcode code, std::string_view url) {
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT: return RetryCause::kTimeout;
    case CURLE_PARTIAL_FILE: return RetryCause::kTruncated;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR: return RetryCause::kConnection;
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_BAD_CONTENT_ENCODING: return RetryCause::kMalformed;
    case CURLE_UNSUPPORTED_PROTOCOL:
      if (url.starts_with("http://") || url.starts_with("https://")) return RetryCause::kMalformed;
      return std::nullopt;
    default: return std::nullopt;
  }
}

RetryCause status_cause(long status) {
  if (status == 429 || status == 503) return RetryCause::kThrottled;
  if (status == 408) return RetryCause::kTimeout;
  return RetryCause::kServerError;
}

// "<what>: <error> (N retries)": the message of a request that failed.
std::string failure_text(const std::string& what, const std::string& error, int retries) {
  std::string out = what;
  out += ": ";
  out += error;
  out += " (";
  out += retries_text(retries);
  out += ")";
  return out;
}

// Parses a decimal number filling all of s.
std::optional<std::uint64_t> parse_u64(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

// Sleeps `d`, waking every 50 ms to check io (throws as check_io does).
void sleep_checked(std::chrono::milliseconds d, const IoOptions& io, const std::string& what) {
  auto until = Clock::now() + d;
  while (Clock::now() < until) {
    if (io_expired(io)) check_io(io, what);
    std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(50)));
  }
}

std::chrono::milliseconds jittered_backoff(const RetryPolicy& policy, int retry) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  long long cap = policy.initial_backoff.count();
  for (int i = 1; i < retry && cap < policy.max_backoff.count(); ++i) cap *= 2;
  cap = std::min<long long>(cap, policy.max_backoff.count());
  if (cap <= 0) return std::chrono::milliseconds(0);
  const double floor = std::clamp(policy.jitter_floor, 0.0, 1.0);
  const auto low = static_cast<long long>(floor * static_cast<double>(cap));
  return std::chrono::milliseconds(std::uniform_int_distribution<long long>(low, cap)(rng));
}

}  // namespace

struct HttpClient::Handle {
  CURL* curl = nullptr;
  Handle() : curl(curl_easy_init()) {
    if (curl == nullptr) throw StorageError(StorageError::Kind::kOther, "libcurl: curl_easy_init failed");
  }
  ~Handle() { curl_easy_cleanup(curl); }
};

// 501 Not Implemented is the server's lasting answer (s3s-fs to ListMultipartUploads): a retry
// would only get it again.
bool is_retryable_status(long status) {
  return status == 408 || status == 429 || (status >= 500 && status <= 599 && status != 501);
}

std::uint64_t body_size(const Request& request) {
  if (request.body_pieces.empty()) return request.body.size();
  std::uint64_t bytes = 0;
  for (ByteSpan piece : request.body_pieces) bytes += piece.size();
  return bytes;
}

std::string check_range_answer(const ByteRange& asked, std::string_view content_range, std::uint64_t body_bytes) {
  const std::uint64_t asked_last = asked.offset + asked.length - 1;
  const std::string wanted = "asked for bytes " + std::to_string(asked.offset) + "-" + std::to_string(asked_last);
  std::string_view spec = content_range;
  if (!spec.starts_with("bytes ")) {
    return "206 without a byte Content-Range (\"" + std::string(content_range) + "\"), " + wanted;
  }
  spec.remove_prefix(6);
  const std::size_t dash = spec.find('-');
  const std::size_t slash = spec.find('/');
  std::optional<std::uint64_t> first, last, total;
  if (slash != std::string_view::npos) total = parse_u64(spec.substr(slash + 1));  // nullopt for "*"
  // Nothing of the range exists (Azurite answers an empty blob with "bytes 0--1/0"): no
  // bytes, and the caller reports past-the-end.
  if (total && *total <= asked.offset && body_bytes == 0) return "";
  if (dash != std::string_view::npos && slash != std::string_view::npos && dash < slash) {
    first = parse_u64(spec.substr(0, dash));
    last = parse_u64(spec.substr(dash + 1, slash - dash - 1));
  }
  if (!first || !last || *last < *first) {
    return "206 with a malformed Content-Range \"" + std::string(content_range) + "\", " + wanted;
  }
  const bool shorter_object = total && *last + 1 == *total && *last < asked_last;
  if (*first != asked.offset || (*last != asked_last && !shorter_object) || body_bytes != *last - *first + 1) {
    return "206 for bytes " + std::to_string(*first) + "-" + std::to_string(*last) +
           (total ? " of " + std::to_string(*total) : std::string()) + " (" + std::to_string(body_bytes) +
           " body bytes), " + wanted;
  }
  return "";
}

std::optional<std::uint64_t> content_range_total(std::string_view content_range) {
  if (!content_range.starts_with("bytes ")) return std::nullopt;
  const std::size_t slash = content_range.rfind('/');
  if (slash == std::string_view::npos) return std::nullopt;
  return parse_u64(content_range.substr(slash + 1));
}

std::optional<std::uint64_t> object_size_of(const Response& ranged_get) {
  if (ranged_get.status == 200) return ranged_get.bytes_received;
  return content_range_total(ranged_get.header("content-range"));
}

std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string strip_query(std::string_view url) { return std::string(url.substr(0, url.find('?'))); }

HttpClient::HttpClient(RetryPolicy policy) : policy_(policy) {
  global_init();
  if (policy_.max_attempts < 1) policy_.max_attempts = 1;
}

HttpClient::~HttpClient() = default;

std::unique_ptr<HttpClient::Handle> HttpClient::take_handle() {
  {
    MutexLock lock(mu_);
    if (!idle_.empty()) {
      auto h = std::move(idle_.back());
      idle_.pop_back();
      return h;
    }
  }
  return std::make_unique<Handle>();
}

void HttpClient::give_back(std::unique_ptr<Handle> handle) {
  MutexLock lock(mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(std::move(handle));
}

Response HttpClient::execute(const Request& request, const IoOptions& io, const std::string& what) {
  std::string last_error;
  bool fresh_connection = false;  // the previous attempt's connection gave a bad answer
  for (int attempt = 0;; ++attempt) {
    if (io_expired(io)) check_io(io, what);
    Response response;
    response.retries = attempt;
    Transfer t;
    char error[CURL_ERROR_SIZE] = {0};
    t.request = &request;
    t.pieces = request.body_pieces.empty() ? std::span<const ByteSpan>(&request.body, 1) : request.body_pieces;
    t.body_bytes = body_size(request);
    t.response = &response;
    t.io = &io;

    // A new handle has no connections: the retry of a bad answer cannot land on another
    // pooled connection that holds junk from the same server.
    std::unique_ptr<Handle> handle = fresh_connection ? std::make_unique<Handle>() : take_handle();
    CURL* c = handle->curl;
    t.curl = c;
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &on_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(policy_.connect_timeout.count()));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, policy_.low_speed_bytes);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(policy_.low_speed_time.count())));
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    // Larger buffers than curl's 16 KiB / 64 KiB defaults: fewer callbacks and syscalls for
    // the multi-MiB parts, blocks and ranges the drivers move. The upload buffer stays in a
    // core's L2, where the kernel's copy into the socket finds what on_read() just wrote:
    // 256 KiB took 3-4 % less client CPU per GB of S3 save than 2 MiB, and 14 MiB less RSS
    // per rank.
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(c, CURLOPT_UPLOAD_BUFFERSIZE, 256L * 1024);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    if (io.deadline != Clock::time_point::max()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(io.deadline - Clock::now()).count();
      curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max<long long>(left, 1)));
    }
    if (!request.aws_sigv4.empty()) {
      curl_easy_setopt(c, CURLOPT_AWS_SIGV4, request.aws_sigv4.c_str());
      curl_easy_setopt(c, CURLOPT_USERPWD, request.userpwd.c_str());
    }

    const std::string& m = request.method;
    if (request.head || m == "HEAD") {
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (m == "PUT") {
      curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(t.body_bytes));
      curl_easy_setopt(c, CURLOPT_READFUNCTION, &on_read);
      curl_easy_setopt(c, CURLOPT_READDATA, &t);
      curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, &on_seek);
      curl_easy_setopt(c, CURLOPT_SEEKDATA, &t);
    } else if (m == "POST") {
      curl_easy_setopt(c, CURLOPT_POST, 1L);
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t.body_bytes));
      curl_easy_setopt(c, CURLOPT_READFUNCTION, &on_read);
      curl_easy_setopt(c, CURLOPT_READDATA, &t);
      curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, &on_seek);
      curl_easy_setopt(c, CURLOPT_SEEKDATA, &t);
    } else if (m != "GET") {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, m.c_str());
    }

    std::vector<std::string> attempt_headers;
    if (request.sign) {
      attempt_headers = request.headers;
      request.sign(attempt_headers);
    }
    curl_slist* headers = nullptr;
    for (const std::string& h : request.sign ? attempt_headers : request.headers) {
      headers = curl_slist_append(headers, h.c_str());
    }
    // Large bodies go with "Expect: 100-continue"; do not wait for the 100 (some servers never
    // send one). Removing the header ("Expect:") would break libcurl 7.88's SigV4, which
    // signs the emptied header.
    curl_easy_setopt(c, CURLOPT_EXPECT_100_TIMEOUT_MS, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);

    CURLcode code = curl_easy_perform(c);
    curl_slist_free_all(headers);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
    if (code == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);

    for (const char* id : {"x-amz-request-id", "x-ms-request-id", "x-guploader-uploadid"}) {
      if (response.request_id.empty()) response.request_id = response.header(id);
    }

    if (code == CURLE_ABORTED_BY_CALLBACK) {
      check_io(io, what);  // throws: cancelled or deadline
    }
    std::optional<RetryCause> cause;  // set when this attempt is worth another
    bool bad_answer = false;          // no usable response: its connection is not trusted again
    if (code != CURLE_OK) {
      if (t.body_cap) {
        throw StorageError(StorageError::Kind::kOther,
                           what + ": response body larger than " + std::to_string(kMaxBody >> 20) + " MiB");
      }
      bad_answer = true;
      if (t.overflow) {
        cause = RetryCause::kBadRange;
        last_error = "wrong range: the server sent more than the " + std::to_string(request.body_out.size()) +
                     " bytes asked for";
      } else {
        last_error = curl_easy_strerror(code);
        if (error[0] != '\0') last_error += std::string(": ") + error;
        if (code == CURLE_OPERATION_TIMEDOUT && io.deadline != Clock::time_point::max() &&
            Clock::now() >= io.deadline) {
          check_io(io, what);
        }
        cause = transport_cause(code, request.url);
        if (!cause) {
          throw StorageError(StorageError::Kind::kOther, failure_text(what, last_error, attempt));
        }
        std::string prefix(retry_cause_name(*cause));
        prefix += ": ";
        last_error.insert(0, prefix);
      }
    } else if (request.expect_range && response.status == 206) {
      std::string mismatch =
          check_range_answer(*request.expect_range, response.header("content-range"), response.bytes_received);
      if (!mismatch.empty()) {
        bad_answer = true;
        cause = RetryCause::kBadRange;
        last_error = "wrong range: " + mismatch;
      }
    } else if (is_retryable_status(response.status)) {
      cause = status_cause(response.status);
      last_error = "HTTP " + std::to_string(response.status);
    } else if (response.status >= 400 && response.status < 500 && request.body_mismatch &&
               request.body_mismatch(response)) {
      cause = RetryCause::kBodyChecksum;
      last_error = "HTTP " + std::to_string(response.status);
    }
    // A bad answer's connection may still hold the rest of it: close it with its handle.
    if (bad_answer) {
      handle.reset();
    } else {
      give_back(std::move(handle));
    }
    fresh_connection = bad_answer;

    if (!cause) return response;
    if (attempt + 1 >= policy_.max_attempts) {
      count_exhausted();
      if (!bad_answer) return response;  // the caller maps the status (and names retries)
      throw StorageError(StorageError::Kind::kTransient, failure_text(what, last_error, attempt));
    }
    count_retry(*cause);
    sleep_checked(jittered_backoff(policy_, attempt + 1), io, what);
  }
}

std::string xml_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    std::size_t semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      out += s[i];
      continue;
    }
    std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") out += '&';
    else if (ent == "lt") out += '<';
    else if (ent == "gt") out += '>';
    else if (ent == "quot") out += '"';
    else if (ent == "apos") out += '\'';
    else if (ent.starts_with("#")) {
      unsigned long cp = ent.starts_with("#x") ? std::strtoul(std::string(ent.substr(2)).c_str(), nullptr, 16)
                                               : std::strtoul(std::string(ent.substr(1)).c_str(), nullptr, 10);
      if (cp < 0x80) {
        out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
      }
    } else {
      out += std::string(s.substr(i, semi - i + 1));
    }
    i = semi;
  }
  return out;
}

std::vector<std::string_view> xml_blocks(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  const std::string open = "<" + std::string(tag) + ">";
  const std::string close = "</" + std::string(tag) + ">";
  std::size_t pos = 0;
  while (true) {
    std::size_t b = xml.find(open, pos);
    if (b == std::string_view::npos) break;
    b += open.size();
    std::size_t e = xml.find(close, b);
    if (e == std::string_view::npos) break;
    out.push_back(xml.substr(b, e - b));
    pos = e + close.size();
  }
  return out;
}

std::string xml_value(std::string_view xml, std::string_view tag) {
  auto blocks = xml_blocks(xml, tag);
  return blocks.empty() ? std::string() : xml_unescape(blocks.front());
}

StorageError::Kind error_kind(long status) {
  if (status == 404) return StorageError::Kind::kNotFound;
  if (status == 401 || status == 403) return StorageError::Kind::kPermission;
  if (is_retryable_status(status)) return StorageError::Kind::kTransient;
  return StorageError::Kind::kOther;
}

std::string retries_text(int retries) { return std::to_string(retries) + (retries == 1 ? " retry" : " retries"); }

}  // namespace shardpoint::storage::http
