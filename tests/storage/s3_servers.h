// The S3 servers the s3:// tests run on, one of each kind per test process, started at first
// use on 127.0.0.1 and killed at exit:
//   "moto"    moto_server 5.2.1 with SigV4 checked (s3_moto.h); also serves gs:// over GCS's
//             XML API (HMAC keys), which s3s-fs cannot (it only knows S3's bucket rules);
//   "s3s_fs"  s3s-fs 0.14.1 (s3s_fs_server.h), built once by scripts/setup-s3s.sh.
// A test parameterized over kS3ServerKinds runs on both; SP_REQUIRE_S3 gives it its server,
// with the AWS_* variables exported for it, or skips (fails under
// SHARDPOINT_REQUIRE_ORACLES=1) when that server is unavailable.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "s3_moto.h"
#include "s3_test_server.h"
#include "s3s_fs_server.h"
#include "test_util.h"

namespace shardpoint::storage::testing {

// The buckets every shared server has.
inline const std::vector<std::string>& shared_buckets() {
  static const std::vector<std::string> buckets = {"sp-test", "sp-gcs"};
  return buckets;
}

// A new server of `kind` ("moto", "s3s_fs"); nullptr and *why when unavailable.
inline std::unique_ptr<S3TestServer> start_s3_server(const std::string& kind, const std::vector<std::string>& buckets,
                                                     std::string* why) {
  if (kind == "moto") return MotoServer::start(buckets, why);
  if (kind == "s3s_fs") return S3sFsServer::start(buckets, why);
  *why = "unknown S3 test server kind \"" + kind + "\"";
  return nullptr;
}

// The process-wide server of `kind` (started at first use, killed at exit), with its AWS_*
// variables exported. nullptr when unavailable; *why says why.
inline S3TestServer* shared_s3_server(const std::string& kind, std::string* why) {
  struct Started {
    std::unique_ptr<S3TestServer> server;
    std::string why;
  };
  static std::map<std::string, Started> servers;
  auto it = servers.find(kind);
  if (it == servers.end()) {
    Started s;
    s.server = start_s3_server(kind, shared_buckets(), &s.why);
    it = servers.emplace(kind, std::move(s)).first;
  }
  *why = it->second.why;
  if (it->second.server) it->second.server->export_environment();
  return it->second.server.get();
}

inline S3TestServer* shared_moto(std::string* why) { return shared_s3_server("moto", why); }

// The multipart uploads in progress in `bucket`; -1 when they cannot be counted.
inline int open_uploads(const S3TestServer& server, const std::string& bucket) { return server.open_uploads(bucket); }

// What ::testing::Values takes for tests parameterized over the servers, and their names.
inline auto s3_server_kinds() { return ::testing::Values(std::string("moto"), std::string("s3s_fs")); }
struct S3ServerKindName {
  std::string operator()(const ::testing::TestParamInfo<std::string>& info) const { return info.param; }
};

// Skips (or fails under SHARDPOINT_REQUIRE_ORACLES=1) when the server is unavailable.
#define SP_REQUIRE_S3(var, kind)                                            \
  std::string var##_why;                                                    \
  ::shardpoint::storage::testing::S3TestServer* var =                       \
      ::shardpoint::storage::testing::shared_s3_server((kind), &var##_why); \
  if (var == nullptr) {                                                     \
    if (::shardpoint::testing::oracles_required()) FAIL() << var##_why;     \
    GTEST_SKIP() << var##_why;                                              \
  }

#define SP_REQUIRE_MOTO(var) SP_REQUIRE_S3(var, "moto")

}  // namespace shardpoint::storage::testing
