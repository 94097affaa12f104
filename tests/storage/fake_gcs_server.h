// fsouza's fake-gcs-server (the GCS emulator: JSON API, resumable uploads, ranged reads,
// ifGenerationMatch; installed and cached by scripts/setup-fake-gcs.sh) on 127.0.0.1 for the
// gs:// JSON API tests: started on a port in 21000-28999 reserved for it
// (comm::reserve_port), in-memory, with the given buckets (folders of its -data folder),
// killed by PID (also when the test process dies: PR_SET_PDEATHSIG).
//
// It checks no credentials (any bearer token is accepted) and has no fault controls: the
// tests of a wrong token, of retries and of request counts stay on gcs_json_server.py.
//
// A missing fake-gcs-server (no go, no network) skips the test, or fails it when
// SHARDPOINT_REQUIRE_ORACLES=1.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/launch.h"
#include "server_process.h"
#include "test_util.h"

namespace shardpoint::storage::testing {

class FakeGcsServer {
 public:
  // Starts a server with the given (empty) buckets; nullptr (and *why set) when
  // fake-gcs-server is not installed or did not come up.
  static std::unique_ptr<FakeGcsServer> start(const std::vector<std::string>& buckets, std::string* why) {
    std::string bin;
    if (const char* env = std::getenv("SHARDPOINT_FAKE_GCS_SERVER"); env != nullptr && *env != '\0') {
      bin = env;
    } else {  // installs when missing, answers at once from its cache
      auto r = ::shardpoint::testing::run_command(std::string(SP_SOURCE_DIR) + "/scripts/setup-fake-gcs.sh");
      bin = r.output;
      while (!bin.empty() && (bin.back() == '\n' || bin.back() == ' ')) bin.pop_back();
    }
    if (bin.empty() || ::access(bin.c_str(), X_OK) != 0) {
      *why = "fake-gcs-server unavailable (scripts/setup-fake-gcs.sh: go install; see its warning)";
      return nullptr;
    }
    auto server = std::unique_ptr<FakeGcsServer>(new FakeGcsServer(bin));
    for (const auto& b : buckets) std::filesystem::create_directories(server->data_.path() / b);
    server->port_reservation_ = comm::reserve_port();
    if (!server->launch(server->port_reservation_.port(), why)) return nullptr;
    return server;
  }

  ~FakeGcsServer() { kill(); }
  FakeGcsServer(const FakeGcsServer&) = delete;
  FakeGcsServer& operator=(const FakeGcsServer&) = delete;

  // SIGKILL and reap; idempotent.
  void kill() { kill_server_process(&pid_); }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Exports what open_storage() (and the CLI the tests run) reads for gs:// on the JSON API:
  // a bearer token (any: it checks none), this endpoint, no HMAC keys (they would pick the
  // XML API), short retry backoffs.
  void export_environment() const {
    ::unsetenv("GCS_HMAC_ACCESS_ID");
    ::unsetenv("GCS_HMAC_SECRET");
    ::setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.sp-fake-gcs-token", 1);
    ::setenv("GCS_JSON_ENDPOINT_URL", endpoint().c_str(), 1);
    ::setenv("SHARDPOINT_HTTP_MAX_ATTEMPTS", "3", 1);
    ::setenv("SHARDPOINT_HTTP_BACKOFF_MS", "10", 1);
  }

 private:
  explicit FakeGcsServer(std::string bin) : bin_(std::move(bin)) {}

  bool launch(int port, std::string* why) {
    port_ = port;
    const std::string log =
        "/tmp/shardpoint-fake-gcs-" + std::to_string(::getpid()) + "-" + std::to_string(port) + ".log";
    const std::string port_text = std::to_string(port);
    // -backend memory: the -data folders only name the buckets; -external-url: the
    // resumable session URLs it returns point back at this port.
    pid_ = start_server_process("fake-gcs-server",
                                ::shardpoint::testing::shell_quote(bin_) + " -scheme http -host 127.0.0.1 -port " +
                                    port_text + " -backend memory -data " +
                                    ::shardpoint::testing::shell_quote(data_.path().string()) + " -external-url " +
                                    endpoint() + " -public-host 127.0.0.1:" + port_text + " -log-level warn",
                                port, log, why);
    return pid_ > 0;
  }

  std::string bin_;
  ::shardpoint::testing::TempDir data_;
  comm::PortReservation port_reservation_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// The process-wide server with bucket "sp-gcs-json" (started at first use, killed at exit),
// its variables exported. nullptr when unavailable; *why says why.
inline FakeGcsServer* shared_fake_gcs(std::string* why) {
  static std::string reason;
  static std::unique_ptr<FakeGcsServer> server = FakeGcsServer::start({"sp-gcs-json"}, &reason);
  *why = reason;
  if (server) server->export_environment();
  return server.get();
}

// Skips (or fails under SHARDPOINT_REQUIRE_ORACLES=1) when fake-gcs-server is unavailable.
#define SP_REQUIRE_FAKE_GCS(var)                                                                                    \
  std::string var##_why;                                                                                            \
  ::shardpoint::storage::testing::FakeGcsServer* var = ::shardpoint::storage::testing::shared_fake_gcs(&var##_why); \
  if (var == nullptr) {                                                                                             \
    if (::shardpoint::testing::oracles_required()) FAIL() << var##_why;                                             \
    GTEST_SKIP() << var##_why;                                                                                      \
  }

}  // namespace shardpoint::storage::testing
