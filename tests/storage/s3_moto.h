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
// s3_servers.h has the process-wide servers and the macros the tests use.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/launch.h"
#include "s3_test_server.h"
#include "storage/http/http_client.h"
#include "test_util.h"

namespace shardpoint::storage::testing {

class MotoServer final : public S3TestServer {
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

  ~MotoServer() override { kill(); }
  MotoServer(const MotoServer&) = delete;
  MotoServer& operator=(const MotoServer&) = delete;

  std::string kind() const override { return "moto"; }

  void kill() override { kill_server_process(&pid_); }

  // moto keeps state in memory: the fresh server has a new user, key and buckets.
  bool restart(std::string* why) override {
    kill();
    return launch(port_, why);
  }

  std::string endpoint() const override { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const override { return port_; }
  const std::string& access_key() const override { return access_key_; }
  const std::string& secret_key() const override { return secret_key_; }

  // ListMultipartUploads, signed.
  int open_uploads(const std::string& bucket) const override {
    http::HttpClient client;
    http::Request r;
    r.url = endpoint() + "/" + bucket + "?uploads=";
    r.headers.push_back("x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    r.aws_sigv4 = "aws:amz:us-east-1:s3";
    r.userpwd = access_key_ + ":" + secret_key_;
    http::Response resp = client.execute(r, {}, "list uploads");
    if (resp.status != 200) return -1;
    int n = 0;
    for (std::size_t pos = 0; (pos = resp.body.find("<Upload>", pos)) != std::string::npos; ++pos) ++n;
    return n;
  }

 private:
  explicit MotoServer(std::vector<std::string> buckets) : buckets_(std::move(buckets)) {}

  bool launch(int port, std::string* why) {
    port_ = port;
    const std::string script = std::string(SP_SOURCE_DIR) + "/tests/storage/s3_moto_server.py";
    const std::string log = "/tmp/shardpoint-moto-" + std::to_string(::getpid()) + "-" + std::to_string(port) + ".log";
    pid_ = start_server_process("moto_server",
                                "env INITIAL_NO_AUTH_ACTION_COUNT=3 python3 '" + script + "' " + std::to_string(port),
                                port, log, why);
    if (pid_ < 0) return false;
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

}  // namespace shardpoint::storage::testing
