// What the S3 tests need of an S3 server they start on 127.0.0.1: its endpoint and keys, a
// way to kill and restart it, and the number of multipart uploads in progress. Implemented
// by MotoServer (s3_moto.h: moto_server, IAM keys, in-memory) and S3sFsServer
// (s3s_fs_server.h: s3s-fs, one static key, objects as files); s3_servers.h picks one by
// kind for the parameterized tests.
#pragma once

#include <cstdlib>
#include <string>

#include "server_process.h"  // accepting()

namespace shardpoint::storage::testing {

class S3TestServer {
 public:
  virtual ~S3TestServer() = default;

  // "moto" or "s3s_fs": the suffix of the parameterized tests' names.
  virtual std::string kind() const = 0;
  virtual std::string endpoint() const = 0;
  virtual int port() const = 0;
  virtual const std::string& access_key() const = 0;
  virtual const std::string& secret_key() const = 0;
  // SIGKILL and reap; idempotent.
  virtual void kill() = 0;
  // A fresh server on the same port, with empty buckets (the ones it started with) and new
  // state: no objects, no uploads. False (and *why) when it did not come up.
  virtual bool restart(std::string* why) = 0;
  // Multipart uploads in progress in `bucket`; -1 when they cannot be counted.
  virtual int open_uploads(const std::string& bucket) const = 0;

  // Exports the AWS_* variables the driver reads for URLs opened through open_storage()
  // (and the CLI the tests run), with short retry backoffs so failures return quickly.
  void export_environment() const {
    ::setenv("AWS_ACCESS_KEY_ID", access_key().c_str(), 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", secret_key().c_str(), 1);
    ::unsetenv("AWS_SESSION_TOKEN");
    ::unsetenv("AWS_PROFILE");
    ::setenv("AWS_REGION", "us-east-1", 1);
    ::setenv("AWS_ENDPOINT_URL", endpoint().c_str(), 1);
    ::setenv("GCS_HMAC_ACCESS_ID", access_key().c_str(), 1);
    ::setenv("GCS_HMAC_SECRET", secret_key().c_str(), 1);
    ::setenv("GCS_ENDPOINT_URL", endpoint().c_str(), 1);
    ::setenv("SHARDPOINT_HTTP_MAX_ATTEMPTS", "3", 1);
    ::setenv("SHARDPOINT_HTTP_BACKOFF_MS", "10", 1);
  }
};

}  // namespace shardpoint::storage::testing
