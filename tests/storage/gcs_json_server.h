// The GCS JSON API test server (tests/storage/gcs_json_server.py) as a test fixture: a real
// HTTP server on 127.0.0.1 (a free port the server picks and reports), started by the test
// and killed by PID (also when the test process dies: PR_SET_DEATHSIG). Python 3's standard
// library is all it needs, so it never skips.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "python_child.h"
#include "storage/http/http_client.h"

namespace shardpoint::storage::testing {

class GcsJsonServer {
 public:
  // Starts a server that accepts `token` for `buckets`, listing in pages of page_size.
  // nullptr (and *why set) when it did not come up.
  static std::unique_ptr<GcsJsonServer> start(const std::string& token, const std::vector<std::string>& buckets,
                                              int page_size, std::string* why) {
    int fds[2];
    if (::pipe(fds) != 0) {
      *why = "pipe failed";
      return nullptr;
    }
    const std::string script = std::string(SP_SOURCE_DIR) + "/tests/storage/gcs_json_server.py";
    std::vector<std::string> args = {"python3", script, token};
    for (const auto& b : buckets) args.push_back(b);
    args.push_back("--page-size");
    args.push_back(std::to_string(page_size));
    pid_t pid = spawn_python3(std::move(args), fds);
    auto server = std::unique_ptr<GcsJsonServer>(new GcsJsonServer(pid, token));
    FILE* out = ::fdopen(fds[0], "r");
    int port = 0;
    if (out == nullptr || std::fscanf(out, "PORT %d", &port) != 1 || port <= 0) {
      *why = "gcs_json_server.py did not report its port (is python3 on PATH?)";
      if (out != nullptr) std::fclose(out);
      return nullptr;
    }
    std::fclose(out);  // the server prints nothing more
    server->port_ = port;
    return server;
  }

  ~GcsJsonServer() { kill(); }
  GcsJsonServer(const GcsJsonServer&) = delete;
  GcsJsonServer& operator=(const GcsJsonServer&) = delete;

  // SIGKILL and reap; idempotent.
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& token() const { return token_; }

  // Fails the next `count` requests whose "METHOD path?query" contains match (after
  // skipping `skip` of them): mode "503" answers 503, "drop" closes the connection.
  void inject_fault(const std::string& mode, int count, const std::string& match = "", int skip = 0) {
    control("POST", "/_control/fault?mode=" + mode + "&count=" + std::to_string(count) +
                        "&skip=" + std::to_string(skip) + "&match=" + http::uri_encode(match, false));
  }

  // {"requests": N, "sessions": N, "objects": N, "session_bytes": N (held by open sessions),
  //  "chunk_sizes": [N, ...] (the body of every session PUT so far, in arrival order)}
  nlohmann::json state() { return nlohmann::json::parse(control("GET", "/_control/state")); }

 private:
  GcsJsonServer(pid_t pid, std::string token) : pid_(pid), token_(std::move(token)) {}

  std::string control(const std::string& method, const std::string& path) {
    http::Request r;
    r.method = method;
    r.url = endpoint() + path;
    http::Response resp = client_.execute(r, {}, "test server control");
    if (resp.status != 200)
      throw std::runtime_error("test server control " + path + ": HTTP " + std::to_string(resp.status));
    return resp.body;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::string token_;
  http::HttpClient client_{http::RetryPolicy{.max_attempts = 1}};
};

}  // namespace shardpoint::storage::testing
