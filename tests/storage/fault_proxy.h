// The fault-injecting HTTP proxy (tests/storage/fault_proxy.py) as a test fixture: started in
// front of a real test server (moto, Azurite, gcs_json_server.py) on 127.0.0.1 at a free port
// the proxy picks and reports, killed by PID (also when the test process dies:
// PR_SET_PDEATHSIG). Python 3's standard library is all it needs.
//
// A test points a driver's endpoint at endpoint(), sets a schedule of faults (fault_proxy.py
// documents the rules and kinds), runs real requests and reads back what was injected.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "python_child.h"
#include "storage/http/http_client.h"

namespace shardpoint::storage::testing {

class FaultProxy {
 public:
  // Starts a proxy to `upstream` ("http://127.0.0.1:PORT") that holds "slow" answers
  // slow_seconds. nullptr (and *why set) when it did not come up.
  static std::unique_ptr<FaultProxy> start(const std::string& upstream, double slow_seconds, std::string* why) {
    int fds[2];
    if (::pipe(fds) != 0) {
      *why = "pipe failed";
      return nullptr;
    }
    const std::string script = std::string(SP_SOURCE_DIR) + "/tests/storage/fault_proxy.py";
    std::vector<std::string> args = {"python3", script, upstream, "--slow-seconds", std::to_string(slow_seconds)};
    pid_t pid = spawn_python3(std::move(args), fds);
    auto proxy = std::unique_ptr<FaultProxy>(new FaultProxy(pid));
    FILE* out = ::fdopen(fds[0], "r");
    int port = 0;
    if (out == nullptr || std::fscanf(out, "PORT %d", &port) != 1 || port <= 0) {
      *why = "fault_proxy.py did not report its port (is python3 on PATH?)";
      if (out != nullptr) std::fclose(out);
      return nullptr;
    }
    std::fclose(out);
    proxy->port_ = port;
    return proxy;
  }

  ~FaultProxy() { kill(); }
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  // SIGKILL and reap; idempotent.
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Replaces the schedule ("RGET 1 1 truncate\nPUT 2 1 503"; "" = no faults) and resets the
  // request numbering and the counts.
  void set_faults(const std::string& schedule) { control("POST", "/_proxy/faults", schedule); }

  // Faults injected since the schedule was set, by kind.
  std::map<std::string, int> faults() {
    std::map<std::string, int> out;
    const nlohmann::json all = stats();  // kept alive: the loop reads into it
    for (const auto& [kind, n] : all["faults"].items()) out[kind] = n.get<int>();
    return out;
  }

  // {"requests": {selector: n}, "faults": {kind: n}, "log": ["kind METHOD path", ...]}
  nlohmann::json stats() { return nlohmann::json::parse(control("GET", "/_proxy/stats", "")); }

 private:
  explicit FaultProxy(pid_t pid) : pid_(pid) {}

  std::string control(const std::string& method, const std::string& path, const std::string& body) {
    http::Request r;
    r.method = method;
    r.url = endpoint() + path;
    r.body = as_bytes(body);
    http::Response resp = client_.execute(r, {}, "fault proxy control");
    if (resp.status != 200) throw std::runtime_error("fault proxy " + path + ": HTTP " + std::to_string(resp.status));
    return resp.body;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  http::HttpClient client_{http::RetryPolicy{.max_attempts = 1}};
};

}  // namespace shardpoint::storage::testing
