// The Azure Blob driver against Azurite through fault_proxy.py (faults from servers, issue 15
// item 4): ranged reads survive every fault kind with the exact bytes, each met by a retry
// counted under its cause; exhausted retries fail in one line naming the blob; a block
// upload through faults commits exactly the bytes written; bodies damaged on the way are
// refused by their Content-MD5 and sent again, borrowed pieces too.
#include <gtest/gtest.h>

#include "azure_test_util.h"
#include "core/buffer_pool.h"
#include "fault_proxy.h"
#include "server_faults.h"
#include "shardpoint/error.h"
#include "storage/azure/azure_storage.h"

namespace shardpoint::storage::testing {
namespace {

FaultProxy* proxy_for(const std::string& azurite) {
  static std::unique_ptr<FaultProxy> p = [&] {
    std::string why;
    auto started = FaultProxy::start(azurite, /*slow_seconds=*/3.5, &why);
    if (!started) std::cerr << why << "\n";
    return started;
  }();
  return p.get();
}

// Fast retries and a 2 s stall limit (the proxy's slow answers take 3.5 s).
azure::AzureConfig faults_config(const std::string& endpoint, int attempts) {
  azure::AzureConfig config = azurite_config(endpoint);
  config.max_attempts = attempts;
  config.backoff_base = std::chrono::milliseconds(5);
  config.backoff_max = std::chrono::milliseconds(50);
  config.stall_timeout = std::chrono::seconds(2);
  return config;
}

// Azurite (skipped without it, as every Azure test) with the proxy in front.
class AzureFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SP_REQUIRE_AZURITE(endpoint);
    endpoint_ = endpoint;
    proxy_ = proxy_for(endpoint);
    ASSERT_NE(proxy_, nullptr) << "fault_proxy.py did not start";
  }

  std::string endpoint_;
  FaultProxy* proxy_ = nullptr;
};

// Storage options whose writers upload blocks of 1 MiB (the pool's buffer size).
StorageOptions one_mib_blocks() {
  BufferPoolOptions pool;
  pool.buffer_bytes = std::size_t{1} << 20;
  pool.capacity_bytes = std::size_t{8} << 20;
  StorageOptions options;
  options.buffer_pool = std::make_shared<BufferPool>(pool);
  return options;
}

TEST_F(AzureFaultsTest, RangedReadsSurviveEveryFaultKind) {
  const std::string url = fresh_container(azurite_config(endpoint_)) + "/faults";
  auto st = azure::open_azure_storage_with(Location::parse(url), faults_config(proxy_->endpoint(), 4));
  read_through_every_fault(*st, *proxy_, "obj");
}

TEST_F(AzureFaultsTest, ExhaustedRetriesFailInOneLineNamingTheBlob) {
  const std::string url = fresh_container(azurite_config(endpoint_)) + "/exhausted";
  auto st = azure::open_azure_storage_with(Location::parse(url), faults_config(proxy_->endpoint(), 3));
  expect_exhausted_read_names_object(*st, *proxy_, "reset.bin", "reset", "2 retries");
  expect_exhausted_read_names_object(*st, *proxy_, "garbage.bin", "garbage", "malformed response");
  expect_exhausted_read_names_object(*st, *proxy_, "busy.bin", "503", "HTTP 503");
}

TEST_F(AzureFaultsTest, BlockUploadThroughFaultsCommitsExactlyTheBytesWritten) {
  const std::string url = fresh_container(azurite_config(endpoint_)) + "/upload";
  auto st =
      azure::open_azure_storage_with(Location::parse(url), faults_config(proxy_->endpoint(), 4), one_mib_blocks());
  auto direct = azure::open_azure_storage_with(Location::parse(url), faults_config(endpoint_, 4));
  const std::string data = pattern_bytes((std::size_t{3} << 20) + 9, 9);  // 4 blocks + the block list
  // PUT 1-4 are Put Block (in parallel: any order), PUT 5 is Put Block List. A reset answer
  // to a stored block is retried (Put Block with the same id is idempotent).
  proxy_->set_faults("PUT 1 1 503\nPUT 3 1 reset\nPUT 5 1 500\n");
  const http::RetryCounts before = http::retry_counts();
  auto w = st->open_writer("big.bin");
  w->append(as_bytes(data));
  w->commit();
  const http::RetryCounts added = http::retry_counts_since(before, http::retry_counts());
  std::cout << "[blocks upload] " << http::describe_retry_counts(added) << "\n";
  EXPECT_EQ(proxy_->faults(), (std::map<std::string, int>{{"503", 1}, {"reset", 1}, {"500", 1}}));
  EXPECT_EQ(added[http::RetryCause::kThrottled], 1u);
  EXPECT_EQ(added[http::RetryCause::kServerError], 1u);
  EXPECT_GE(added[http::RetryCause::kConnection] + added[http::RetryCause::kTruncated], 1u);
  proxy_->set_faults("");
  std::string got(data.size(), '\0');
  direct->read("big.bin", 0, std::as_writable_bytes(std::span(got)));
  EXPECT_TRUE(got == data);
}

// Request bodies damaged on the way (the proxy's damagebody): Azurite refuses each by its
// Content-MD5 (400 InvalidOperation "Provided contentMD5 doesn't match."; Azure: 400
// Md5Mismatch), the driver sends it again and the blob holds exactly the bytes written.
// Damaged on every attempt, the write fails in one line naming the blob and leaves no blob.
TEST_F(AzureFaultsTest, DamagedBodiesAreRefusedByTheirMd5AndSentAgain) {
  const std::string url = fresh_container(azurite_config(endpoint_)) + "/damaged";
  auto st =
      azure::open_azure_storage_with(Location::parse(url), faults_config(proxy_->endpoint(), 4), one_mib_blocks());
  auto direct = azure::open_azure_storage_with(Location::parse(url), faults_config(endpoint_, 4));
  const std::string data = pattern_bytes((std::size_t{3} << 20) + 9, 15);  // 4 blocks + the block list
  const std::string small = pattern_bytes(100000, 16);

  // PUT 1-4 are Put Block (in parallel: any order) and their retries, then Put Block List.
  expect_damaged_bodies_sent_again(*st, *direct, *proxy_, "blocks.bin", data, /*atomic=*/false,
                                   "PUT 1 1 damagebody\nPUT 3 1 damagebody\n", 2);
  expect_damaged_bodies_sent_again(*st, *direct, *proxy_, "put.bin", small, /*atomic=*/true, "PUT 1 1 damagebody\n", 1);

  // Blocks of borrowed pieces with copies between them: a refused one sends the same pieces
  // again, from the start.
  {
    SCOPED_TRACE("borrowed pieces");
    proxy_->set_faults("PUT 2 1 damagebody\nPUT 4 1 damagebody\n");
    const http::RetryCounts before = http::retry_counts();
    std::string expected;
    auto w = st->open_writer("borrowed.bin");
    for (std::size_t at = 0; at < data.size(); at += 300000) {
      w->append(as_bytes(small).first(at % 1000 + 1));
      w->append_borrowed(as_bytes(data).subspan(at, std::min<std::size_t>(300000, data.size() - at)));
      expected += small.substr(0, at % 1000 + 1) + data.substr(at, 300000);
    }
    w->commit();
    const http::RetryCounts added = http::retry_counts_since(before, http::retry_counts());
    EXPECT_EQ(proxy_->faults(), (std::map<std::string, int>{{"damagebody", 2}}));
    EXPECT_EQ(added[http::RetryCause::kBodyChecksum], 2u);
    proxy_->set_faults("");
    std::string got(expected.size(), '\0');
    direct->read("borrowed.bin", 0, std::as_writable_bytes(std::span(got)));
    EXPECT_TRUE(got == expected) << "the blob differs from the bytes written";
  }

  expect_failed_write_leaves_nothing(*st, *direct, *proxy_, "never-blocks.bin", data, /*atomic=*/false,
                                     "PUT 1 0 damagebody\n", "did not match its Content-MD5", "3 retries");
  expect_failed_write_leaves_nothing(*st, *direct, *proxy_, "never-put.bin", small, /*atomic=*/true,
                                     "PUT 1 0 damagebody\n", "did not match its Content-MD5", "3 retries");
}

}  // namespace
}  // namespace shardpoint::storage::testing
