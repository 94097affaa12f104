// A real moto_server on 127.0.0.1 for the object-store tests: started on a port
// in 21000-28999 reserved for it (comm::reserve_port: no other shardpoint launcher or test
// server on this machine takes it while it runs) with signature checking on (INITIAL_NO_AUTH_ACTION_COUNT=3), prepared
// by s3_moto_setup.py (IAM user, allow-all policy, access key, buckets), killed by PID.
//
// tests/storage/s3_moto_server.py runs moto with one fix: its SigV4 check hashes the request
// target exactly as sent (moto 5.2.1 decodes it first, so '=' in keys or '/' in a list
// prefix fail even for boto3). Signatures are still verified.
//
// A missing moto (python3 on PATH without moto and boto3) skips the test with a clear
// message, or fails it when SHARDPOINT_REQUIRE_ORACLES=1 (as test_util.h's oracle macros).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/launch.h"
#include "storage/http/http_client.h"
#include "test_util.h"

namespace shardpoint::storage::testing {

class MotoServer {
 public:
  // Starts a server with the given buckets; nullptr (and *why set) when moto is missing or
  // did not come up.
  static std::unique_ptr<MotoServer> start(const std::vector<std::string>& buckets, std::string* why) {
    if (::shardpoint::testing::run_command("python3 -c 'import moto, boto3' 2>/dev/null").exit_code != 0) {
      *why = "moto_server missing: python3 on PATH has no moto/boto3 (pip install 'moto[server]' boto3)";
      return nullptr;
    }
    auto server = std::unique_ptr<MotoServer>(new MotoServer(buckets));
    server->port_reservation_ = comm::reserve_port();
    if (!server->launch(server->port_reservation_.port(), why)) return nullptr;
    return server;
  }

  ~MotoServer() { kill(); }
  MotoServer(const MotoServer&) = delete;
  MotoServer& operator=(const MotoServer&) = delete;

  // SIGKILL and reap; idempotent.
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

  // A fresh server on the same port (moto keeps state in memory: new user, key, buckets).
  bool restart(std::string* why) {
    kill();
    return launch(port_, why);
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }

  // Exports the AWS_* variables the driver reads for URLs opened through open_storage(),
  // with short retry backoffs so failures return quickly.
  void export_environment() const {
    ::setenv("AWS_ACCESS_KEY_ID", access_key_.c_str(), 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", secret_key_.c_str(), 1);
    ::unsetenv("AWS_SESSION_TOKEN");
    ::unsetenv("AWS_PROFILE");
    ::setenv("AWS_REGION", "us-east-1", 1);
    ::setenv("AWS_ENDPOINT_URL", endpoint().c_str(), 1);
    ::setenv("GCS_HMAC_ACCESS_ID", access_key_.c_str(), 1);
    ::setenv("GCS_HMAC_SECRET", secret_key_.c_str(), 1);
    ::setenv("GCS_ENDPOINT_URL", endpoint().c_str(), 1);
    ::setenv("SHARDPOINT_HTTP_MAX_ATTEMPTS", "3", 1);
    ::setenv("SHARDPOINT_HTTP_BACKOFF_MS", "10", 1);
  }

 private:
  explicit MotoServer(std::vector<std::string> buckets) : buckets_(std::move(buckets)) {}

  static bool accepting(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
  }

  bool launch(int port, std::string* why) {
    port_ = port;
    const std::string script = std::string(SP_SOURCE_DIR) + "/tests/storage/s3_moto_server.py";
    const std::string log = "/tmp/shardpoint-moto-" + std::to_string(::getpid()) + "-" + std::to_string(port) + ".log";
    pid_t pid = ::fork();
    if (pid == 0) {
      // Dies with the test process, even when that one aborts without running destructors.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::setenv("INITIAL_NO_AUTH_ACTION_COUNT", "3", 1);
      std::string port_text = std::to_string(port);
      std::string cmd = "exec python3 '" + script + "' " + port_text + " >'" + log + "' 2>&1";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pid_ = pid;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!accepting(port)) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        *why = "moto_server exited at start (log: " + log + ")";
        return false;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        *why = "moto_server did not accept connections on port " + std::to_string(port) + " within 30 s";
        kill();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::string cmd = "python3 '" + std::string(SP_SOURCE_DIR) + "/tests/storage/s3_moto_setup.py' " + endpoint();
    for (const std::string& b : buckets_) cmd += " " + b;
    auto result = ::shardpoint::testing::run_command(cmd + " 2>>'" + log + "'");
    std::istringstream in(result.output);
    in >> access_key_ >> secret_key_;
    if (result.exit_code != 0 || secret_key_.empty()) {
      *why = "moto setup failed (log: " + log + ")";
      kill();
      return false;
    }
    return true;
  }

  std::vector<std::string> buckets_;
  comm::PortReservation port_reservation_;  // held while this object lives (restarts reuse it)
  pid_t pid_ = -1;
  int port_ = 0;
  std::string access_key_;
  std::string secret_key_;
};

// The multipart uploads in progress in `bucket` (ListMultipartUploads, signed); -1 when the
// listing fails.
inline int open_uploads(const MotoServer& moto, const std::string& bucket) {
  http::HttpClient client;
  http::Request r;
  r.url = moto.endpoint() + "/" + bucket + "?uploads=";
  r.headers.push_back("x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  r.aws_sigv4 = "aws:amz:us-east-1:s3";
  r.userpwd = moto.access_key() + ":" + moto.secret_key();
  http::Response resp = client.execute(r, {}, "list uploads");
  if (resp.status != 200) return -1;
  int n = 0;
  for (std::size_t pos = 0; (pos = resp.body.find("<Upload>", pos)) != std::string::npos; ++pos) ++n;
  return n;
}

// The process-wide server of a test binary (started at first use, killed at exit).
// Returns nullptr when unavailable; *why says why.
inline MotoServer* shared_moto(std::string* why) {
  static std::string reason;
  static std::unique_ptr<MotoServer> server = [] {
    auto s = MotoServer::start({"sp-test", "sp-gcs"}, &reason);
    if (s) s->export_environment();
    return s;
  }();
  *why = reason;
  return server.get();
}

// Skips (or fails under SHARDPOINT_REQUIRE_ORACLES=1) when moto is unavailable.
#define SP_REQUIRE_MOTO(var)                                                           \
  std::string var##_why;                                                               \
  ::shardpoint::storage::testing::MotoServer* var =                                    \
      ::shardpoint::storage::testing::shared_moto(&var##_why);                         \
  if (var == nullptr) {                                                                \
    if (::shardpoint::testing::oracles_required()) FAIL() << var##_why;                \
    GTEST_SKIP() << var##_why;                                                         \
  }

}  // namespace shardpoint::storage::testing
