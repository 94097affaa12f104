// s3s-fs (the s3s project's S3 server over a folder, installed and cached by
// scripts/setup-s3s.sh) on 127.0.0.1 for the S3 tests: started on a port in 21000-28999
// reserved for it (comm::reserve_port), with one access key whose SigV4 signatures it
// verifies, a bucket per folder of its root (a temporary folder), killed by PID.
//
// What it lacks that moto has: ListMultipartUploads (501), so open_uploads() counts the
// upload records s3s-fs keeps in its root (".upload-<id>.json", removed by
// CompleteMultipartUpload and AbortMultipartUpload); no IAM (one static key).
//
// A missing s3s-fs (no cargo, no network) skips the test, or fails it when
// SHARDPOINT_REQUIRE_ORACLES=1.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/launch.h"
#include "s3_test_server.h"
#include "test_util.h"

namespace shardpoint::storage::testing {

class S3sFsServer final : public S3TestServer {
 public:
  // Starts a server with the given (empty) buckets; nullptr (and *why set) when s3s-fs is
  // not installed or did not come up.
  static std::unique_ptr<S3sFsServer> start(const std::vector<std::string>& buckets, std::string* why) {
    const std::string bin = binary(why);
    if (bin.empty()) return nullptr;
    auto server = std::unique_ptr<S3sFsServer>(new S3sFsServer(bin, buckets));
    server->port_reservation_ = comm::reserve_port();
    if (!server->launch(server->port_reservation_.port(), why)) return nullptr;
    return server;
  }

  ~S3sFsServer() override { kill(); }
  S3sFsServer(const S3sFsServer&) = delete;
  S3sFsServer& operator=(const S3sFsServer&) = delete;

  std::string kind() const override { return "s3s_fs"; }
  std::string endpoint() const override { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const override { return port_; }
  const std::string& access_key() const override { return access_key_; }
  const std::string& secret_key() const override { return secret_key_; }

  void kill() override { kill_server_process(&pid_); }

  // A new root folder: the fresh server has empty buckets and no uploads, as moto's restart.
  bool restart(std::string* why) override {
    kill();
    root_ = std::make_unique<::shardpoint::testing::TempDir>();
    return launch(port_, why);
  }

  // s3s-fs keeps one ".upload-<id>.json" per upload in progress in its root, whatever the
  // bucket (each test process has its own server).
  int open_uploads(const std::string& /*bucket*/) const override {
    int n = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(root_->path(), ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(".upload-", 0) == 0 && name.size() > 5 && name.substr(name.size() - 5) == ".json") ++n;
    }
    return ec ? -1 : n;
  }

 private:
  S3sFsServer(std::string bin, std::vector<std::string> buckets)
      : bin_(std::move(bin)),
        buckets_(std::move(buckets)),
        root_(std::make_unique<::shardpoint::testing::TempDir>()),
        secret_key_("sp-s3s-secret-" + std::to_string(::getpid())) {}

  // $SHARDPOINT_S3S_FS, else what scripts/setup-s3s.sh prints (it installs when missing and
  // answers at once from its cache).
  static std::string binary(std::string* why) {
    if (const char* env = std::getenv("SHARDPOINT_S3S_FS"); env != nullptr && *env != '\0') return env;
    auto r = ::shardpoint::testing::run_command(std::string(SP_SOURCE_DIR) + "/scripts/setup-s3s.sh");
    std::string path = r.output;
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    if (r.exit_code != 0 || path.empty() || ::access(path.c_str(), X_OK) != 0) {
      *why = "s3s-fs unavailable (scripts/setup-s3s.sh: cargo install s3s-fs; see its warning)";
      return "";
    }
    return path;
  }

  bool launch(int port, std::string* why) {
    port_ = port;
    for (const auto& b : buckets_) std::filesystem::create_directories(root_->path() / b);
    const std::string log = "/tmp/shardpoint-s3s-" + std::to_string(::getpid()) + "-" + std::to_string(port) + ".log";
    pid_ = start_server_process("s3s-fs",
                                ::shardpoint::testing::shell_quote(bin_) + " --host 127.0.0.1 --port " +
                                    std::to_string(port) + " --access-key " + access_key_ + " --secret-key " +
                                    secret_key_ + " " + ::shardpoint::testing::shell_quote(root_->path().string()),
                                port, log, why);
    return pid_ > 0;
  }

  std::string bin_;
  std::vector<std::string> buckets_;
  std::unique_ptr<::shardpoint::testing::TempDir> root_;
  comm::PortReservation port_reservation_;  // held while this object lives (restarts reuse it)
  pid_t pid_ = -1;
  int port_ = 0;
  std::string access_key_ = "SPS3SFSTESTKEY000001";
  std::string secret_key_;
};

}  // namespace shardpoint::storage::testing
