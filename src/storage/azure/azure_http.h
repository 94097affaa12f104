// One HTTP exchange over libcurl, for the Azure Blob driver: no retries, no signing (the
// driver signs each attempt afresh and decides what to retry).
//
// Connections are reused: an HttpConnectionPool keeps idle curl easy handles (and with them
// their keep-alive connections) for the next request. curl_global_init runs once, on first use.
//
// The response body goes to a caller's fixed buffer (ranged GETs straight into the
// destination, no copy) when the status is 2xx and `into` is set; otherwise to
// HttpResponse::body (error bodies and XML), capped at 64 MiB.
//
// Cancellation: the request's stop token and deadline are checked by curl's progress
// callback (about every second, and on every chunk), which aborts the transfer.
//
// Thread-safety: HttpConnectionPool is thread-safe; perform() may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "core/byte_io.h"

namespace shardpoint::storage::azure {

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, DELETE
  std::string url;     // full URL with query (may hold a SAS: never put it in a message)
  std::vector<std::pair<std::string, std::string>> headers;
  ByteSpan body;                                   // PUT body
  std::span<std::byte> into;                       // 2xx GET body destination (optional)
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds stall_timeout{60000};  // < 1 KiB/s for this long fails
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::stop_token stop;
};

struct HttpResponse {
  // 0 when no HTTP status arrived (transport error; see transport_error).
  long status = 0;
  // curl's error text for a transport failure ("Couldn't connect to server: ..."), empty
  // otherwise. Never holds the request URL.
  std::string transport_error;
  bool aborted = false;           // stopped by the stop token or the deadline
  std::map<std::string, std::string> headers;  // lower-cased names
  std::string body;               // see the top of this file
  std::uint64_t received = 0;     // bytes written to `into`
  bool overflow = false;          // the server sent more than `into` holds

  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

class HttpConnectionPool {
 public:
  HttpConnectionPool();
  ~HttpConnectionPool();
  HttpConnectionPool(const HttpConnectionPool&) = delete;
  HttpConnectionPool& operator=(const HttpConnectionPool&) = delete;

  // Runs one request. Blocks. Never throws for HTTP or transport failures (they are in the
  // response); throws std::bad_alloc only.
  HttpResponse perform(const HttpRequest& request);

 private:
  void* take();
  void give_back(void* handle);

  std::mutex mu_;
  std::vector<void*> idle_;  // GUARDED_BY(mu_): CURL* easy handles
};

}  // namespace shardpoint::storage::azure
