// The "s3" and "gs" (XML API) drivers against real servers with signature checking: the
// conformance suite on s3:// (moto and s3s-fs) and gs:// over the XML API (moto), then what
// only an object store has on both S3 servers (multipart, abort, parallel ranged reads, auth
// errors), URL parsing, credentials files, registration.
#include "storage/s3/s3_storage.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/buffer_pool.h"
#include "s3_servers.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/gcs/gcs_storage.h"
#include "storage/http/http_client.h"
#include "storage/memory_storage.h"
#include "storage/s3/aws_credentials.h"
#include "storage_conformance.h"
#include "storage_test_util.h"
#include "test_util.h"

namespace shardpoint::storage::testing {
namespace {

std::atomic<int> g_root_counter{0};

std::string fresh_root(const std::string& scheme, const std::string& bucket) {
  return scheme + "://" + bucket + "/conf-" + std::to_string(::getpid()) + "-" + std::to_string(g_root_counter++);
}

// Records the skip (or failure) for the running test; the placeholder storage is never used.
void skip_without_server(const std::string& why) {
  if (::shardpoint::testing::oracles_required()) FAIL() << why;
  GTEST_SKIP() << why;
}

StorageUnderTest make_remote(const std::string& scheme, const std::string& bucket, const std::string& server) {
  std::string why;
  if (shared_s3_server(server, &why) == nullptr) {
    skip_without_server(why);
    return {open_memory_storage(Location::parse("memory://"), {}), nullptr};
  }
  return {open_storage(fresh_root(scheme, bucket)), nullptr};
}

StorageUnderTest make_s3() { return make_remote("s3", "sp-test", "moto"); }
StorageUnderTest make_s3_s3s_fs() { return make_remote("s3", "sp-test", "s3s_fs"); }
StorageUnderTest make_gcs_xml() { return make_remote("gs", "sp-gcs", "moto"); }

INSTANTIATE_TEST_SUITE_P(Remote, StorageConformanceTest,
                         ::testing::Values(StorageFactory{"s3_moto", &make_s3},
                                           StorageFactory{"s3_s3s_fs", &make_s3_s3s_fs,
                                                          /*prefix_keys_answer_not_found=*/false},
                                           StorageFactory{"gcs_xml_moto", &make_gcs_xml}),
                         StorageFactoryName());

// What only an object store has, on each S3 server (s3_servers.h).
class S3ServerTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(S3, S3ServerTest, s3_server_kinds(), S3ServerKindName());

TEST_P(S3ServerTest, MultipartParallelUploadAndParallelRangedReads) {
  SP_REQUIRE_S3(server, GetParam());
  auto st = open_storage(fresh_root("s3", "sp-test"));
  // 5 MiB parts in a pool of 4 buffers: parts upload in parallel within a bounded pool.
  StorageOptions options;
  BufferPoolOptions po;
  po.buffer_bytes = std::size_t{5} << 20;
  po.capacity_bytes = std::size_t{20} << 20;
  options.buffer_pool = std::make_shared<BufferPool>(po);
  s3::S3Config config = s3::s3_config(Location::parse(st->url()));
  config.read_chunk_bytes = std::size_t{1} << 20;
  config.parallel_read_bytes = std::size_t{2} << 20;
  auto s3 = s3::make_s3_storage(config, options);
  const std::string data = pattern((std::size_t{23} << 20) + 12345, 5);
  auto w = s3->open_writer("big/__0_0.distcp");
  for (std::size_t pos = 0; pos < data.size(); pos += 3000017) {
    w->append(as_bytes(std::string_view(data).substr(pos, 3000017)));
  }
  EXPECT_EQ(open_uploads(*server, "sp-test"), 1);  // started when the first part was full
  EXPECT_FALSE(s3->try_stat("big/__0_0.distcp"));  // nothing visible before commit
  w->commit();
  EXPECT_EQ(options.buffer_pool->leased_buffers(), 0u);
  EXPECT_EQ(open_uploads(*server, "sp-test"), 0);
  EXPECT_EQ(s3->stat("big/__0_0.distcp"), data.size());
  std::string got(data.size() - 7, '\0');
  s3->read("big/__0_0.distcp", 7, std::as_writable_bytes(std::span(got)));  // 22 parallel GETs
  EXPECT_TRUE(got == data.substr(7));
  auto source = s3->open_source("big/__0_0.distcp");
  EXPECT_EQ(source->read_string(data.size() - 100, 100, "tail"), data.substr(data.size() - 100));
  EXPECT_EQ(source->read_string(5 << 20, 3 << 20, "middle"), data.substr(5 << 20, 3 << 20));
  // Replaced under an open lazy source: an error, never a mixture of versions.
  s3->write_atomic("big/__0_0.distcp", as_bytes(pattern(data.size(), 6)));
  try {
    source->read_string(1 << 20, 10, "after replace");
    FAIL() << "read of a replaced object succeeded";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("changed since it was opened"), std::string::npos) << e.what();
  }
}

// A save's shape: small copied headers between large borrowed spans, so the 5 MiB parts are
// lists of pieces, some of a span that crosses a part boundary. The server checks each
// part's signed SHA-256 and CRC-32C (computed by the writer as it appended), and the object
// holds exactly the bytes.
TEST_P(S3ServerTest, BorrowedSpansWithCopiesBetweenThemMakeTheObject) {
  SP_REQUIRE_S3(server, GetParam());
  auto st = open_storage(fresh_root("s3", "sp-test"));
  const std::string tensors = pattern((std::size_t{13} << 20) + 999, 7);
  std::string expected;
  auto w = st->open_writer("borrowed/__0_0.distcp");
  std::size_t at = 0;
  for (std::size_t n = 1; at < tensors.size(); ++n) {
    const std::string header = pattern(64 + n % 200, static_cast<int>(n));
    w->append(as_bytes(header));
    expected += header;
    const std::string_view span = std::string_view(tensors).substr(at, (std::size_t{1} << 20) + 4096 * n);
    w->append_borrowed(as_bytes(span));
    expected += span;
    at += span.size();
  }
  w->commit();
  EXPECT_EQ(open_uploads(*server, "sp-test"), 0);
  ASSERT_EQ(st->stat("borrowed/__0_0.distcp"), expected.size());
  std::string got(expected.size(), '\0');
  st->read("borrowed/__0_0.distcp", 0, std::as_writable_bytes(std::span(got)));
  EXPECT_TRUE(got == expected);
}

TEST_P(S3ServerTest, UncommittedMultipartWriterAbortsItsUpload) {
  SP_REQUIRE_S3(server, GetParam());
  auto st = open_storage(fresh_root("s3", "sp-test"));
  ASSERT_EQ(open_uploads(*server, "sp-test"), 0);
  {
    auto w = st->open_writer("partial.distcp");
    w->append(as_bytes(pattern(std::size_t{20} << 20, 1)));
    EXPECT_EQ(open_uploads(*server, "sp-test"), 1);
  }
  EXPECT_EQ(open_uploads(*server, "sp-test"), 0);
  EXPECT_TRUE(st->list("").empty());
}

TEST_P(S3ServerTest, WrongKeyIsAPermissionErrorNamingTheUrlNotTheSecret) {
  SP_REQUIRE_S3(server, GetParam());
  const std::string url = fresh_root("s3", "sp-test");
  s3::S3Config config = s3::s3_config(Location::parse(url));
  config.credentials.secret_access_key = "wrong-secret-0123456789";
  auto st = s3::make_s3_storage(config);
  for (int op = 0; op < 3; ++op) {
    try {
      if (op == 0) st->write_atomic(".metadata", as_bytes(std::string_view("x")));
      if (op == 1) st->list("");
      if (op == 2) st->stat("x");
      FAIL() << "request with a wrong secret succeeded (op " << op << ")";
    } catch (const StorageError& e) {
      std::string what = e.what();
      EXPECT_EQ(e.kind(), StorageError::Kind::kPermission) << what;
      EXPECT_NE(what.find(url), std::string::npos) << what;
      EXPECT_EQ(what.find("wrong-secret"), std::string::npos) << what;
      EXPECT_EQ(what.find(server->secret_key()), std::string::npos) << what;
      if (op != 2) {
        EXPECT_NE(what.find("SignatureDoesNotMatch"), std::string::npos) << what;
      }
      EXPECT_NE(what.find("request id"), std::string::npos) << what;
    }
  }
}

TEST_P(S3ServerTest, KeysWithReservedCharactersRoundTrip) {
  SP_REQUIRE_S3(server, GetParam());
  auto st = open_storage(fresh_root("s3", "sp-test"));
  for (std::string key : {"step=3/__0_0.distcp", "a b/c+d", "x%2Fy", "utf8-\xc3\xa9/k", "t~_-./q"}) {
    st->write_atomic(key, as_bytes(key));
    std::string got(key.size(), '\0');
    st->read(key, 0, std::as_writable_bytes(std::span(got)));
    EXPECT_EQ(got, key);
  }
  EXPECT_EQ(st->list("step=").size(), 1u);
  EXPECT_EQ(st->list("a b/").size(), 1u);
  EXPECT_EQ(st->list("").size(), 5u);
  EXPECT_EQ(st->remove_all(), 5u);
}

TEST_P(S3ServerTest, ListPagesThroughManyObjects) {
  SP_REQUIRE_S3(server, GetParam());
  auto st = open_storage(fresh_root("s3", "sp-test"));
  // Both servers page at 1000 keys: 1005 objects need two pages.
  std::vector<std::exception_ptr> errors(8);
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        try {
          for (int i = t; i < 1005; i += 8)
            st->write_atomic("k/" + std::to_string(10000 + i), as_bytes(std::string_view("")));
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    }
  }
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  auto all = st->list("k/");
  ASSERT_EQ(all.size(), 1005u);
  EXPECT_EQ(all.front().key, "k/10000");
  EXPECT_EQ(all.back().key, "k/11004");
  EXPECT_EQ(st->remove_prefix("k/"), 1005u);
}

TEST(S3StorageTest, RetriesThenReportsTransientErrorsWithRetryCount) {
  // Nothing listens on this port: connection refused is retried, then kTransient.
  s3::S3Config config;
  config.bucket = "sp-test";
  config.endpoint = "http://127.0.0.1:1";
  config.path_style = true;
  config.retry.max_attempts = 3;
  config.retry.initial_backoff = std::chrono::milliseconds(1);
  auto st = s3::make_s3_storage(config);
  try {
    st->stat("x");
    FAIL();
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kTransient) << e.what();
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("2 retries"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("s3://sp-test/x"), std::string::npos) << e.what();
  }
}

// Sets or clears environment variables for one scope, restoring them after.
class EnvGuard {
 public:
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvGuard() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(S3UrlTest, ParsesAndRejectsStrictly) {
  EnvGuard env;
  env.set("AWS_REGION", "eu-west-1");
  env.set("AWS_ENDPOINT_URL", nullptr);
  env.set("AWS_ENDPOINT_URL_S3", nullptr);
  s3::S3Config c = s3::s3_config(Location::parse("s3://my-bucket/ckpt/run1/"));
  EXPECT_EQ(c.bucket, "my-bucket");
  EXPECT_EQ(c.prefix, "ckpt/run1");
  EXPECT_EQ(c.region, "eu-west-1");
  EXPECT_EQ(c.endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(c.path_style);
  auto st = s3::make_s3_storage(c);
  EXPECT_EQ(st->url(), "s3://my-bucket/ckpt/run1");
  EXPECT_EQ(st->describe_key("__0_0.distcp"), "S3 object \"s3://my-bucket/ckpt/run1/__0_0.distcp\"");

  c = s3::s3_config(Location::parse("s3://b-1.x?region=us-west-2&endpoint=http://127.0.0.1:9000/&addressing=virtual"));
  EXPECT_EQ(c.prefix, "");
  EXPECT_EQ(c.region, "us-west-2");
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:9000");
  EXPECT_FALSE(c.path_style);
  EXPECT_EQ(s3::make_s3_storage(c)->url(),
            "s3://b-1.x?region=us-west-2&endpoint=http://127.0.0.1:9000/&addressing=virtual");
  EXPECT_TRUE(s3::s3_config(Location::parse("s3://bkt?endpoint=http://localhost:1")).path_style);

  for (std::string bad :
       {"s3://", "s3://b", "s3://Bucket/x", "s3://bu_cket", "s3://-bkt", "s3://bkt/a//b", "s3://bkt/a/../b",
        "s3://bkt/./a", "s3://bkt/x#frag", "s3://bkt?colour=red", "s3://bkt?region", "s3://bkt?addressing=sideways",
        "s3://bkt?endpoint=ftp://h", "s3://bkt/x.sp-tmp.1"}) {
    try {
      s3::s3_config(Location::parse(bad));
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  try {
    s3::s3_config(Location::parse("s3://bkt?colour=red"));
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("accepted: region, endpoint, addressing, profile"), std::string::npos);
  }
}

TEST(S3UrlTest, PayloadGoesUnsignedOnlyWhereACrc32cCoversItOverTls) {
  using Signing = s3::S3Config::PayloadSigning;
  s3::S3Config c;
  c.endpoint = "https://s3.us-east-1.amazonaws.com";
  EXPECT_TRUE(s3::sends_unsigned_payload(c));  // kAuto over TLS
  c.endpoint = "http://127.0.0.1:9000";
  EXPECT_FALSE(s3::sends_unsigned_payload(c));  // kAuto over plain http: signed
  c.payload_signing = Signing::kUnsigned;
  EXPECT_TRUE(s3::sends_unsigned_payload(c));
  c.checksum_crc32c = false;  // nothing would cover the body
  EXPECT_FALSE(s3::sends_unsigned_payload(c));
  c.checksum_crc32c = true;
  c.payload_signing = Signing::kSigned;
  c.endpoint = "https://s3.us-east-1.amazonaws.com";
  EXPECT_FALSE(s3::sends_unsigned_payload(c));

  EnvGuard env;
  env.set("SHARDPOINT_S3_PAYLOAD", "unsigned");
  EXPECT_EQ(s3::s3_config(Location::parse("s3://bkt?endpoint=http://127.0.0.1:1")).payload_signing, Signing::kUnsigned);
  env.set("SHARDPOINT_S3_PAYLOAD", "signed");
  EXPECT_EQ(s3::s3_config(Location::parse("s3://bkt")).payload_signing, Signing::kSigned);
  env.set("SHARDPOINT_S3_PAYLOAD", "auto");
  EXPECT_EQ(s3::s3_config(Location::parse("s3://bkt")).payload_signing, Signing::kAuto);
  env.set("SHARDPOINT_S3_PAYLOAD", "sometimes");
  try {
    s3::s3_config(Location::parse("s3://bkt"));
    ADD_FAILURE() << "SHARDPOINT_S3_PAYLOAD=sometimes was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("SHARDPOINT_S3_PAYLOAD=\"sometimes\""), std::string::npos) << e.what();
  }
}

TEST(S3UrlTest, PartsInFlightComeFromTheEnvironmentWithinBounds) {
  EnvGuard env;
  env.set("SHARDPOINT_S3_PARTS_IN_FLIGHT", nullptr);
  EXPECT_EQ(s3::s3_config(Location::parse("s3://bkt")).max_parallel_parts, s3::S3Config().max_parallel_parts);
  env.set("SHARDPOINT_S3_PARTS_IN_FLIGHT", "10");  // boto3's max_concurrency
  EXPECT_EQ(s3::s3_config(Location::parse("s3://bkt")).max_parallel_parts, 10);
  env.set("SHARDPOINT_S3_PARTS_IN_FLIGHT", "1000");
  EXPECT_EQ(s3::s3_config(Location::parse("s3://bkt")).max_parallel_parts, 64);
  env.set("SHARDPOINT_S3_PARTS_IN_FLIGHT", "many");
  EXPECT_THROW(s3::s3_config(Location::parse("s3://bkt")), UsageError);
}

TEST(S3UrlTest, GcsUrlsFollowGcsBucketRules) {
  EXPECT_NO_THROW(gcs::open_gcs_storage(Location::parse("gs://my_bucket/ckpt?endpoint=http://127.0.0.1:1"), {}));
  EXPECT_THROW(gcs::open_gcs_storage(Location::parse("gs://my_bucket?region=x"), {}), UsageError);
  EXPECT_THROW(gcs::open_gcs_storage(Location::parse("gs://UPPER"), {}), UsageError);
  auto st = gcs::open_gcs_storage(Location::parse("gs://my_bucket/ckpt?endpoint=http://127.0.0.1:1"), {});
  EXPECT_EQ(st->describe_key("k"), "GCS object \"gs://my_bucket/ckpt/k\"");
}

TEST(S3UrlTest, EverySchemeResolvesThroughTheRegistry) {
  auto schemes = registered_storage_schemes();
  for (const char* s : {"file", "memory", "s3", "gs"}) {
    EXPECT_NE(std::find(schemes.begin(), schemes.end(), s), schemes.end()) << s;
  }
  EXPECT_EQ(open_storage("s3://bkt/p?endpoint=http://127.0.0.1:1")->url(), "s3://bkt/p?endpoint=http://127.0.0.1:1");
  EXPECT_EQ(open_storage("gs://bkt/p?endpoint=http://127.0.0.1:1")->url(), "gs://bkt/p?endpoint=http://127.0.0.1:1");
}

TEST(AwsCredentialsTest, EnvironmentThenProfiles) {
  shardpoint::testing::TempDir dir;
  const std::string creds = dir.file("credentials");
  const std::string config = dir.file("config");
  shardpoint::testing::write_text(creds, "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = sdefault\n"
                                         "# comment\n[other]\naws_access_key_id=AKOTHER\naws_secret_access_key=sother\n"
                                         "aws_session_token = tok\n");
  shardpoint::testing::write_text(config, "[profile cfg]\nregion = ap-south-1\nendpoint_url = http://h:1\n"
                                          "aws_access_key_id = AKCFG\naws_secret_access_key = scfg\n");
  EnvGuard env;
  for (const char* n : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                        "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"}) {
    env.set(n, nullptr);
  }
  env.set("AWS_SHARED_CREDENTIALS_FILE", creds.c_str());
  env.set("AWS_CONFIG_FILE", config.c_str());

  EXPECT_EQ(s3::load_aws_credentials().access_key_id, "AKDEFAULT");
  ::setenv("AWS_PROFILE", "other", 1);
  s3::AwsCredentials other = s3::load_aws_credentials();
  EXPECT_EQ(other.access_key_id, "AKOTHER");
  EXPECT_EQ(other.session_token, "tok");
  EXPECT_EQ(other.source, "profile \"other\" in " + creds);
  EXPECT_EQ(s3::load_aws_credentials("cfg").access_key_id, "AKCFG");
  EXPECT_EQ(s3::load_aws_region("cfg"), "ap-south-1");
  EXPECT_EQ(s3::load_aws_endpoint("cfg"), "http://h:1");
  EXPECT_TRUE(s3::load_aws_credentials("missing").empty());
  ::setenv("AWS_ACCESS_KEY_ID", "AKENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "senv", 1);
  EXPECT_EQ(s3::load_aws_credentials().access_key_id, "AKENV");
  EXPECT_EQ(s3::load_aws_credentials().source, "environment (AWS_ACCESS_KEY_ID)");
  EXPECT_EQ(s3::load_aws_credentials("other").access_key_id, "AKOTHER");  // an explicit profile wins
  s3::S3Config c = s3::s3_config(Location::parse("s3://bkt?profile=cfg"));
  EXPECT_EQ(c.credentials.access_key_id, "AKCFG");
  EXPECT_EQ(c.region, "ap-south-1");
  EXPECT_EQ(c.endpoint, "http://h:1");
  EXPECT_TRUE(c.path_style);
}

}  // namespace
}  // namespace shardpoint::storage::testing
