#include "storage/azure/azure_http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace shardpoint::storage::azure {
namespace {

constexpr std::size_t kMaxBody = std::size_t{64} << 20;
constexpr std::size_t kMaxIdle = 64;

void global_init() {
  static const bool done = [] {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    return true;
  }();
  (void)done;
}

struct Transfer {
  const HttpRequest* request;
  HttpResponse* response;
  CURL* curl;
  std::size_t body_offset = 0;  // upload position
};

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  if (line.starts_with("HTTP/")) t->response->headers.clear();  // a new response (after 100-continue)
  std::size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) value.remove_suffix(1);
    t->response->headers[name] = std::string(value);
  }
  return size * n;
}

std::size_t on_write(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::size_t bytes = size * n;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 200 && status < 300 && !t->request->into.empty()) {
    std::span<std::byte> into = t->request->into;
    if (t->response->received + bytes > into.size()) {
      t->response->overflow = true;
      return 0;  // aborts the transfer
    }
    std::memcpy(into.data() + t->response->received, data, bytes);
    t->response->received += bytes;
    return bytes;
  }
  if (t->response->body.size() + bytes > kMaxBody) return 0;
  t->response->body.append(data, bytes);
  return bytes;
}

std::size_t on_read(char* buffer, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  ByteSpan body = t->request->body;
  std::size_t bytes = std::min(size * n, body.size() - t->body_offset);
  std::memcpy(buffer, body.data() + t->body_offset, bytes);
  t->body_offset += bytes;
  return bytes;
}

int on_seek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<std::size_t>(offset) > t->request->body.size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  t->body_offset = static_cast<std::size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->request->stop.stop_requested() || std::chrono::steady_clock::now() >= t->request->deadline) {
    t->response->aborted = true;
    return 1;
  }
  return 0;
}

}  // namespace

HttpConnectionPool::HttpConnectionPool() { global_init(); }

HttpConnectionPool::~HttpConnectionPool() {
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* HttpConnectionPool::take() {
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  CURL* curl = curl_easy_init();
  if (curl == nullptr) throw std::bad_alloc();
  return curl;
}

void HttpConnectionPool::give_back(void* handle) {
  std::lock_guard lock(mu_);
  if (idle_.size() < kMaxIdle) {
    idle_.push_back(handle);
  } else {
    curl_easy_cleanup(static_cast<CURL*>(handle));
  }
}

HttpResponse HttpConnectionPool::perform(const HttpRequest& request) {
  HttpResponse response;
  CURL* curl = static_cast<CURL*>(take());
  curl_easy_reset(curl);
  Transfer transfer{&request, &response, curl};
  char error[CURL_ERROR_SIZE] = {0};

  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &on_write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &on_progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request.connect_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(request.stall_timeout.count() / 1000)));
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  // Larger socket buffers than curl's 16 KiB / 64 KiB defaults: fewer callbacks and syscalls
  // for the multi-MiB blocks and ranges this driver moves.
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L * 1024);
  curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, 2L * 1024 * 1024);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  if (request.deadline != std::chrono::steady_clock::time_point::max()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(request.deadline - std::chrono::steady_clock::now());
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, std::max(1L, static_cast<long>(left.count())));
  }

  if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, &on_read);
    curl_easy_setopt(curl, CURLOPT_READDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, &on_seek);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }

  curl_slist* headers = nullptr;
  for (const auto& [k, v] : request.headers) headers = curl_slist_append(headers, (k + ": " + v).c_str());
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  if (request.method == "PUT") headers = curl_slist_append(headers, "Transfer-Encoding:");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

  CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (rc == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  } else if (!(rc == CURLE_WRITE_ERROR && response.overflow)) {
    response.status = 0;
    response.transport_error = std::string(curl_easy_strerror(rc));
    if (error[0] != '\0') response.transport_error += std::string(": ") + error;
  } else {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  }
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  if (rc == CURLE_OK) {
    give_back(curl);
  } else {
    curl_easy_cleanup(curl);  // its connection may be in a bad state
  }
  return response;
}

}  // namespace shardpoint::storage::azure
