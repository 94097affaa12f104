// The "az" driver against a real Azurite on 127.0.0.1 (SharedKey verified by the server):
// the conformance suite with SharedKey and with an account SAS, then driver-specific cases
// (URLs, credentials, paging, bounded parallel blocks, wrong key, a server killed mid-upload).
#include "storage/azure/azure_storage.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>

#include "azure_test_util.h"
#include "core/buffer_pool.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/memory_storage.h"
#include "storage_conformance.h"
#include "storage_test_util.h"

namespace shardpoint::storage::testing {
namespace {

// Records the skip (or failure) for the running test; the placeholder storage is never used.
void skip_without_azurite(const std::string& why) {
  if (oracles_required()) FAIL() << "Azurite required: " << why;
  GTEST_SKIP() << "Azurite unavailable: " << why;
}

StorageUnderTest make_azure(bool sas) {
  std::string why;
  auto endpoint = shared_azurite(&why);
  if (!endpoint) {
    skip_without_azurite(why);
    return {open_memory_storage(Location::parse("memory://"), {}), nullptr};
  }
  azure::AzureConfig config = azurite_config(*endpoint);
  std::string url = fresh_container(config) + "/ckpt/run1";
  if (sas) {
    config.sas_token = azure::make_account_sas(config, "rwdlac", "2099-01-01T00:00:00Z");
    config.account_key.clear();
  }
  // Small buffers so the suite's 9 MiB object goes through Put Block + Put Block List.
  StorageOptions options;
  BufferPoolOptions pool;
  pool.buffer_bytes = std::size_t{1} << 20;
  pool.capacity_bytes = std::size_t{8} << 20;
  options.buffer_pool = std::make_shared<BufferPool>(pool);
  return {azure::open_azure_storage_with(Location::parse(url), config, options), nullptr};
}

StorageUnderTest make_shared_key() { return make_azure(false); }
StorageUnderTest make_sas() { return make_azure(true); }

INSTANTIATE_TEST_SUITE_P(Azure, StorageConformanceTest,
                         ::testing::Values(StorageFactory{"azurite_shared_key", &make_shared_key},
                                           StorageFactory{"azurite_sas", &make_sas}),
                         StorageFactoryName());

// --- no server needed ---

TEST(AzureUrlTest, ParsesAndRoundTrips) {
  azure::AzureLocation a = azure::to_azure_location(Location::parse("az://my-container/checkpoint/step=3/"));
  EXPECT_EQ(a.container, "my-container");
  EXPECT_EQ(a.prefix, "checkpoint/step=3");
  EXPECT_EQ(a.account, "");
  EXPECT_EQ(a.url(), "az://my-container/checkpoint/step=3");
  EXPECT_EQ(azure::to_azure_location(Location::parse(a.url())).url(), a.url());
  azure::AzureLocation b =
      azure::to_azure_location(Location::parse("abfs://my-container@account1.dfs.core.windows.net/checkpoint"));
  EXPECT_EQ(b.account, "account1");
  EXPECT_EQ(b.container, "my-container");
  EXPECT_EQ(b.prefix, "checkpoint");
  EXPECT_EQ(b.url(), "abfs://my-container@account1.dfs.core.windows.net/checkpoint");
  EXPECT_EQ(azure::to_azure_location(Location::parse("abfss://ckpt@acct123.dfs.core.windows.net")).prefix, "");
  EXPECT_EQ(azure::to_azure_location(Location::parse("abfss://ckpt@acct123.dfs.core.chinacloudapi.cn/x")).url(),
            "abfss://ckpt@acct123.dfs.core.chinacloudapi.cn/x");
  EXPECT_EQ(azure::to_azure_location(Location::parse("abfss://ckpt@acct123.blob.core.windows.net/x")).endpoint_suffix,
            "core.windows.net");
  EXPECT_EQ(azure::to_azure_location(Location::parse("az://abc")).url(), "az://abc");
  for (const char* bad : {"az://", "az://My-Container/x", "az://ab/x", "az://a--b/x", "az://-ab/x", "az://abc/x?sv=1",
                          "az://abc/x#f", "az://abc//x", "az://abc/a/../b", "az://abc/./b", "az://user@abc/x",
                          "abfs://abc/x", "abfs://abc@acct.example.com/x", "abfs://abc@A.dfs.core.windows.net",
                          "abfs://abc@acct.dfs.", "s3://abc/x", "az://abc/x.sp-tmp.1"}) {
    EXPECT_THROW(azure::to_azure_location(Location::parse(bad)), UsageError) << bad;
  }
  try {
    azure::to_azure_location(Location::parse("az://abc/x?sig=SECRET"));
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("query"), std::string::npos) << e.what();
  }
}

TEST(AzureUrlTest, EverySchemeResolvesThroughTheRegistry) {
  auto schemes = registered_storage_schemes();
  for (const char* s : {"az", "abfs", "abfss"}) {
    EXPECT_NE(std::find(schemes.begin(), schemes.end(), s), schemes.end()) << s;
  }
  ::setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string("http://127.0.0.1:1").c_str(), 1);
  EXPECT_EQ(open_storage("az://ckpt/a/b")->url(), "az://ckpt/a/b");
  EXPECT_EQ(open_storage("abfs://ckpt@devstoreaccount1.dfs.core.windows.net/a")->url(),
            "abfs://ckpt@devstoreaccount1.dfs.core.windows.net/a");
  EXPECT_THROW(open_storage("abfs://ckpt@otheraccount.dfs.core.windows.net/a"), UsageError);  // not our key's
  EXPECT_THROW(open_storage("az://ckpt/a?x=1"), UsageError);
  ::unsetenv("AZURE_STORAGE_CONNECTION_STRING");
  ::unsetenv("AZURE_STORAGE_ACCOUNT");
  try {
    open_storage("az://ckpt/a");
    FAIL() << "no credentials accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("AZURE_STORAGE_CONNECTION_STRING"), std::string::npos) << e.what();
  }
}

TEST(AzureCredentialsTest, ConnectionStringsAndEnvironment) {
  azure::AzureConfig c = azure::parse_connection_string(
      "DefaultEndpointsProtocol=http; AccountName=devstoreaccount1;AccountKey=" + std::string(kAzuriteKey) +
      ";BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1/;");
  EXPECT_EQ(c.account, "devstoreaccount1");
  EXPECT_EQ(c.account_key, kAzuriteKey);
  EXPECT_EQ(c.blob_endpoint, "http://127.0.0.1:10000/devstoreaccount1");
  EXPECT_EQ(c.describe(), "SharedKey for account \"devstoreaccount1\"");
  EXPECT_EQ(c.describe().find(kAzuriteKey), std::string::npos);

  azure::AzureConfig s = azure::parse_connection_string(
      "BlobEndpoint=https://acct.blob.core.windows.net;SharedAccessSignature=?sv=2020-12-06&sig=abc%3D");
  EXPECT_EQ(s.sas_token, "sv=2020-12-06&sig=abc%3D");
  EXPECT_EQ(s.describe().find("sig="), std::string::npos);

  azure::AzureConfig d = azure::parse_connection_string("UseDevelopmentStorage=true");
  EXPECT_EQ(d.account, "devstoreaccount1");
  EXPECT_EQ(d.blob_endpoint, "http://127.0.0.1:10000/devstoreaccount1");

  try {
    azure::parse_connection_string("AccountName=a;TopSecretWithoutEquals");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).find("TopSecret"), std::string::npos) << e.what();
  }
  EXPECT_THROW(azure::parse_connection_string("AccountName=a;AccountKey=not*base64"), UsageError);

  ::unsetenv("AZURE_STORAGE_CONNECTION_STRING");
  ::setenv("AZURE_STORAGE_ACCOUNT", "acct", 1);
  ::setenv("AZURE_STORAGE_SAS_TOKEN", "?sv=1&sig=x", 1);
  ::setenv("SHARDPOINT_AZURE_MAX_ATTEMPTS", "2", 1);
  azure::AzureConfig e = azure::azure_config_from_env();
  EXPECT_EQ(e.account, "acct");
  EXPECT_EQ(e.sas_token, "sv=1&sig=x");
  EXPECT_EQ(e.max_attempts, 2);
  ::unsetenv("AZURE_STORAGE_ACCOUNT");
  ::unsetenv("AZURE_STORAGE_SAS_TOKEN");
  ::unsetenv("SHARDPOINT_AZURE_MAX_ATTEMPTS");
}

TEST(AzureCredentialsTest, SharedKeySignatureIsStable) {
  // The canonical form: sorted x-ms headers, "/account/path", sorted lower-cased query.
  azure::AzureConfig c;
  c.account = "devstoreaccount1";
  c.account_key = kAzuriteKey;
  azure::SignedRequest r{"GET",
                         "/devstoreaccount1/c",
                         {{"restype", "container"}, {"comp", "list"}},
                         {{"x-ms-version", "2021-12-02"}, {"x-ms-date", "Sun, 29 Nov 2026 19:00:00 GMT"}},
                         0};
  std::string a = azure::shared_key_authorization(c, r);
  EXPECT_TRUE(a.starts_with("SharedKey devstoreaccount1:")) << a;
  EXPECT_EQ(a.size(), std::string("SharedKey devstoreaccount1:").size() + 44);
  std::swap(r.query[0], r.query[1]);  // order-independent
  EXPECT_EQ(azure::shared_key_authorization(c, r), a);
  r.headers[1].second = "Sun, 29 Nov 2026 19:00:01 GMT";
  EXPECT_NE(azure::shared_key_authorization(c, r), a);
  EXPECT_EQ(azure::base64_decode(azure::base64_encode("any bytes\x01"), "t"), "any bytes\x01");
}

// A scripted HTTP server on 127.0.0.1: answers each connection's first request with the next
// canned response (then closes it), so retries of 5xx / 429 can be checked without Azurite.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::vector<std::string> responses) : responses_(std::move(responses)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(fd_, 16);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::jthread([this] {
      for (const std::string& r : responses_) {
        int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[8192];
        std::string req;
        while (req.find("\r\n\r\n") == std::string::npos) {
          ssize_t n = ::recv(c, buf, sizeof buf, 0);
          if (n <= 0) break;
          req.append(buf, static_cast<std::size_t>(n));
        }
        // Counted before the reply: the client may return (and the test read served())
        // as soon as the bytes arrive.
        served_.fetch_add(1);
        ::send(c, r.data(), r.size(), MSG_NOSIGNAL);
        ::close(c);
      }
    });
  }
  ~ScriptedServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int served() const { return served_.load(); }

 private:
  std::vector<std::string> responses_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<int> served_{0};
  std::jthread thread_;
};

std::string http_status(int code, const std::string& extra = "") {
  return "HTTP/1.1 " + std::to_string(code) + " X\r\nx-ms-request-id: req-" + std::to_string(code) +
         "\r\nx-ms-error-code: Code" + std::to_string(code) + "\r\n" + extra +
         "Content-Length: 0\r\nConnection: close\r\n\r\n";
}

TEST(AzureRetryTest, RetriesServerErrorsAndThrottlingThenSucceedsOrReportsTheLastError) {
  {
    ScriptedServer server({http_status(503), http_status(429), http_status(500),
                           "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"});
    azure::AzureConfig config = azurite_config(server.endpoint());
    config.max_attempts = 4;
    auto s = azure::open_azure_storage_with(Location::parse("az://ckpt/p"), config);
    EXPECT_EQ(s->stat("k"), 5u);  // HEAD: the body is not sent
    EXPECT_EQ(server.served(), 4);
  }
  {
    ScriptedServer server({http_status(503), http_status(502), http_status(503)});
    azure::AzureConfig config = azurite_config(server.endpoint());
    config.max_attempts = 3;
    try {
      azure::open_azure_storage_with(Location::parse("az://ckpt/p"), config)->stat("k");
      FAIL();
    } catch (const StorageError& e) {
      std::string m = e.what();
      EXPECT_TRUE(e.retryable()) << m;
      EXPECT_NE(m.find("HTTP 503 Code503"), std::string::npos) << m;
      EXPECT_NE(m.find("request id req-503"), std::string::npos) << m;
      EXPECT_NE(m.find("2 retries"), std::string::npos) << m;
      EXPECT_NE(m.find("az://ckpt/p/k"), std::string::npos) << m;
    }
  }
  {
    ScriptedServer server({http_status(409)});  // not retryable: one request
    try {
      azure::open_azure_storage_with(Location::parse("az://ckpt/p"), azurite_config(server.endpoint()))->stat("k");
      FAIL();
    } catch (const StorageError& e) {
      EXPECT_EQ(e.kind(), StorageError::Kind::kOther) << e.what();
      EXPECT_NE(std::string(e.what()).find("0 retries"), std::string::npos) << e.what();
    }
    EXPECT_EQ(server.served(), 1);
  }
}

// --- against Azurite ---

TEST(AzureStorageTest, WrongKeyIsAPermissionErrorNamingTheUrlNotTheSecret) {
  SP_REQUIRE_AZURITE(endpoint);
  azure::AzureConfig good = azurite_config(endpoint);
  std::string url = fresh_container(good);
  azure::AzureConfig bad = good;
  const std::string wrong_key = azure::base64_encode(std::string(64, 'k'));
  bad.account_key = wrong_key;
  auto s = azure::open_azure_storage_with(Location::parse(url + "/ckpt"), bad);
  for (int op = 0; op < 3; ++op) {
    try {
      if (op == 0) s->write_atomic(".metadata", as_bytes(std::string_view("x")));
      if (op == 1) s->stat(".metadata");
      if (op == 2) s->list("");
      FAIL() << "wrong key accepted, op " << op;
    } catch (const StorageError& e) {
      std::string m = e.what();
      EXPECT_EQ(e.kind(), StorageError::Kind::kPermission) << m;
      EXPECT_NE(m.find(url), std::string::npos) << m;
      EXPECT_NE(m.find("403"), std::string::npos) << m;
      EXPECT_NE(m.find("request id"), std::string::npos) << m;
      EXPECT_EQ(m.find(wrong_key), std::string::npos) << m;
      EXPECT_EQ(m.find(kAzuriteKey), std::string::npos) << m;
      EXPECT_FALSE(e.retryable());
    }
  }
  // A SAS with a bad signature: also kPermission, and the signature is not echoed.
  azure::AzureConfig bad_sas = good;
  bad_sas.account_key.clear();
  bad_sas.sas_token = "sv=2020-12-06&ss=b&srt=sco&sp=rwdl&se=2099-01-01T00%3A00%3A00Z&sig=SECRETSIGNATURE";
  try {
    azure::open_azure_storage_with(Location::parse(url + "/ckpt"), bad_sas)->stat("k");
    FAIL();
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kPermission) << e.what();
    EXPECT_EQ(std::string(e.what()).find("SECRETSIGNATURE"), std::string::npos) << e.what();
  }
  // A read-only SAS can read but not write.
  auto writable = azure::open_azure_storage_with(Location::parse(url + "/ckpt"), good);
  writable->write_atomic("k", as_bytes(std::string_view("v")));
  azure::AzureConfig ro = good;
  ro.sas_token = azure::make_container_sas(good, url.substr(5), "rl", "2099-01-01T00:00:00Z");
  ro.account_key.clear();
  auto reader = azure::open_azure_storage_with(Location::parse(url + "/ckpt"), ro);
  EXPECT_EQ(read_all(*reader, "k"), "v");
  EXPECT_EQ(reader->list("").size(), 1u);
  try {
    reader->write_atomic("k2", as_bytes(std::string_view("v")));
    FAIL();
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kPermission) << e.what();
  }
}

TEST(AzureStorageTest, ListPagesThroughNextMarker) {
  SP_REQUIRE_AZURITE(endpoint);
  azure::AzureConfig config = azurite_config(endpoint);
  std::string url = fresh_container(config);
  config.list_page_size = 3;
  auto s = azure::open_azure_storage_with(Location::parse(url + "/p"), config);
  auto outside = azure::open_azure_storage_with(Location::parse(url + "/p2"), config);
  outside->write_atomic("x", as_bytes(std::string_view("not under p/")));
  std::vector<std::string> want;
  for (int i = 0; i < 11; ++i) {
    std::string key = "d/" + std::to_string(100 + i) + "&<odd>.bin";  // XML-escaped by the service
    s->write_atomic(key, as_bytes(std::string_view("v")));
    want.push_back(key);
  }
  std::vector<ObjectInfo> got = s->list("d/");
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].key, want[i]);
  EXPECT_EQ(s->list("").size(), 11u);
  EXPECT_EQ(s->remove_prefix(""), 11u);
  EXPECT_EQ(outside->list("").size(), 1u);
}

TEST(AzureStorageTest, LargeObjectsUseBoundedParallelBlocksAndParallelRangedReads) {
  SP_REQUIRE_AZURITE(endpoint);
  azure::AzureConfig config = azurite_config(endpoint);
  config.parallelism = 4;
  config.read_chunk_bytes = 1 << 20;
  std::string url = fresh_container(config);
  StorageOptions options;
  BufferPoolOptions pool_options;
  pool_options.buffer_bytes = std::size_t{1} << 20;
  pool_options.capacity_bytes = std::size_t{3} << 20;  // fewer buffers than blocks in flight allow
  auto pool = std::make_shared<BufferPool>(pool_options);
  options.buffer_pool = pool;
  auto s = azure::open_azure_storage_with(Location::parse(url + "/big"), config, options);
  const std::string data = pattern((std::size_t{23} << 20) + 12345, 9);
  auto w = s->open_writer("__0_0.distcp");
  for (std::size_t pos = 0; pos < data.size(); pos += 777777) {
    w->append(as_bytes(std::string_view(data).substr(pos, 777777)));
    EXPECT_LE(pool->allocated_buffers(), 3u);
  }
  EXPECT_FALSE(s->try_stat("__0_0.distcp"));  // blocks staged, nothing committed yet
  w->commit();
  EXPECT_EQ(pool->leased_buffers(), 0u);
  EXPECT_EQ(s->stat("__0_0.distcp"), data.size());
  EXPECT_EQ(read_all(*s, "__0_0.distcp"), data);
  std::string part(5 << 20, '\0');
  s->read("__0_0.distcp", 3333333, std::as_writable_bytes(std::span(part)));
  EXPECT_EQ(part, data.substr(3333333, part.size()));
  // A large source reads ranges pinned to its ETag; a replaced blob is an error, not new bytes.
  config.source_whole_bytes = 1 << 20;
  auto pinned = azure::open_azure_storage_with(Location::parse(url + "/big"), config, options);
  auto source = pinned->open_source("__0_0.distcp");
  EXPECT_EQ(source->read_string(10 << 20, 100, "t"), data.substr(10 << 20, 100));
  s->write_atomic("__0_0.distcp", as_bytes(std::string_view("replaced")));
  EXPECT_THROW(source->read_string(0, 10, "t"), StorageError);
}

// Storage at url whose writers stage 1 MiB blocks from 4 MiB of buffers, so a blob of a few
// MiB is a multi-block one.
std::unique_ptr<Storage> small_block_storage(const std::string& url, const azure::AzureConfig& config) {
  StorageOptions options;
  BufferPoolOptions pool_options;
  pool_options.buffer_bytes = std::size_t{1} << 20;
  pool_options.capacity_bytes = std::size_t{4} << 20;
  options.buffer_pool = std::make_shared<BufferPool>(pool_options);
  return azure::open_azure_storage_with(Location::parse(url), config, options);
}

// Tensor bytes borrowed in 256 KiB slices with copied bytes between them (what the engine's
// save appends): blocks and a one-request blob of several pieces each, sent from the
// caller's memory with the Content-MD5 the writer computed as they were appended (a wrong
// one is refused by Azurite), read back byte for byte.
TEST(AzureStorageTest, BorrowedSpansAreUploadedAndReadBackByteIdentical) {
  SP_REQUIRE_AZURITE(endpoint);
  azure::AzureConfig config = azurite_config(endpoint);
  auto s = small_block_storage(fresh_container(config), config);
  auto save = [&](const std::string& key, std::size_t tensor_bytes, std::uint32_t seed) {
    const std::string tensor = pattern(tensor_bytes, seed);
    std::string expected;
    auto w = s->open_writer(key);
    for (std::size_t at = 0; at < tensor.size(); at += 256 << 10) {
      const std::string header = pattern(30 + at % 97, seed + 1);  // a zip header: copied
      w->append(as_bytes(header));
      const std::string_view slice = std::string_view(tensor).substr(at, 256 << 10);
      w->append_borrowed(as_bytes(slice));
      expected += header;
      expected += slice;
    }
    w->commit();
    EXPECT_EQ(s->stat(key), expected.size()) << key;
    EXPECT_TRUE(read_all(*s, key) == expected) << key << " differs from the bytes written";
  };
  save("blocks.distcp", (std::size_t{3} << 20) + 4097, 21);  // 4 blocks of several pieces
  save("whole.distcp", 600 << 10, 22);                       // one Put Blob of 6 pieces
}

TEST(AzureStorageTest, AbandonedMultiBlockWriterCommitsNothing) {
  SP_REQUIRE_AZURITE(endpoint);
  azure::AzureConfig config = azurite_config(endpoint);
  auto s = small_block_storage(fresh_container(config), config);
  s->write_atomic("k", as_bytes(std::string_view("old")));
  {
    auto w = s->open_writer("k");
    w->append(as_bytes(pattern(5 << 20, 1)));  // 5 blocks staged
  }
  EXPECT_EQ(read_all(*s, "k"), "old");
  EXPECT_EQ(s->list("").size(), 1u);
  // A later writer of the same key is not confused by the stale uncommitted blocks.
  auto w = s->open_writer("k");
  const std::string fresh = pattern((2 << 20) + 5, 2);
  w->append(as_bytes(fresh));
  w->commit();
  EXPECT_EQ(read_all(*s, "k"), fresh);
}

// WriteOptions::if_absent on a multi-block blob: If-None-Match: * on Put Block List.
TEST(AzureStorageTest, CreateOnlyBlockListIsRefusedWhenTheBlobExists) {
  SP_REQUIRE_AZURITE(endpoint);
  azure::AzureConfig config = azurite_config(endpoint);
  auto s = small_block_storage(fresh_container(config), config);
  WriteOptions create_only;
  create_only.if_absent = true;
  const std::string first = pattern((3 << 20) + 5, 1);
  s->write_atomic("k", as_bytes(first), create_only);  // above one buffer: blocks + list
  const std::string second = pattern((3 << 20) + 5, 2);
  auto w = s->open_writer("k", create_only);
  w->append(as_bytes(second));
  try {
    w->commit();
    ADD_FAILURE() << "a create-only block list replaced the blob";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kAlreadyExists) << e.what();
    EXPECT_NE(std::string(e.what()).find("azure blob"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_all(*s, "k"), first);
  // The same bytes again: a retry that finds its own blob counts as written.
  s->write_atomic("k", as_bytes(first), create_only);
  EXPECT_THROW(s->write_atomic("k", as_bytes(second), create_only), StorageError);
  EXPECT_EQ(read_all(*s, "k"), first);
}

TEST(AzureStorageTest, ServerKilledMidUploadFailsAndCommitsNothingThenRecovers) {
  SP_REQUIRE_AZURITE(shared);  // only to skip without Azurite; this test runs its own server
  std::string dir =
      (std::filesystem::temp_directory_path() / ("sp-azurite-kill-" + std::to_string(::getpid()))).string();
  AzuriteProcess server(dir);
  ASSERT_TRUE(server.start()) << server.error();
  azure::AzureConfig config = azurite_config(server.endpoint());
  const std::string url = fresh_container(config);
  auto s = small_block_storage(url, config);
  const std::string data = pattern(8 << 20, 3);
  {
    auto w = s->open_writer("obj");
    w->append(as_bytes(data).first(3 << 20));
    server.stop();  // crash in the middle of the upload
    try {
      w->append(as_bytes(data).subspan(3 << 20));
      w->commit();
      FAIL() << "upload to a dead server succeeded";
    } catch (const StorageError& e) {
      EXPECT_TRUE(e.retryable()) << e.what();
      EXPECT_NE(std::string(e.what()).find("retries"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(url + "/obj"), std::string::npos) << e.what();
    }
  }
  ASSERT_TRUE(server.start()) << server.error();
  azure::create_azure_container(Location::parse(url), config);  // Azurite may lose unsaved metadata on SIGKILL
  EXPECT_FALSE(s->try_stat("obj"));
  EXPECT_TRUE(s->list("").empty());
  auto w = s->open_writer("obj");
  w->append(as_bytes(data));
  w->commit();
  EXPECT_EQ(read_all(*s, "obj"), data);
  server.stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace shardpoint::storage::testing
