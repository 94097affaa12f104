// The gs:// driver on the GCS JSON API against gcs_json_server.py through fault_proxy.py
// (faults from servers, issue 15 item 4): ranged reads survive every fault kind with the
// exact bytes, each met by a retry counted under its cause; exhausted retries fail in one
// line naming the object; a resumable upload through faults commits exactly the bytes
// written; a damaged body is refused by the object's X-Goog-Hash.
#include <gtest/gtest.h>

#include "fault_proxy.h"
#include "gcs_json_server.h"
#include "server_faults.h"
#include "shardpoint/error.h"
#include "storage/gcs/gcs_json_storage.h"
#include "test_util.h"

namespace shardpoint::storage::testing {
namespace {

using shardpoint::testing::unique_name;

constexpr const char* kToken = "ya29.sp-faults-token";

GcsJsonServer& server() {
  static std::unique_ptr<GcsJsonServer> s = [] {
    std::string why;
    auto started = GcsJsonServer::start(kToken, {"sp-gcs-faults"}, /*page_size=*/100, &why);
    if (!started) {
      std::cerr << why << "\n";
      std::abort();
    }
    return started;
  }();
  return *s;
}

FaultProxy& proxy() {
  static std::unique_ptr<FaultProxy> p = [] {
    std::string why;
    auto started = FaultProxy::start(server().endpoint(), /*slow_seconds=*/3.5, &why);
    if (!started) {
      std::cerr << why << "\n";
      std::abort();
    }
    return started;
  }();
  return *p;
}

// Through the proxy; fast retries and a 2 s low-speed limit (the proxy's slow answers take 3.5 s).
std::unique_ptr<Storage> gcs_at(const std::string& endpoint, const std::string& prefix, int attempts = 4) {
  gcs::GcsJsonConfig c;
  c.bucket = "sp-gcs-faults";
  c.prefix = prefix;
  c.endpoint = endpoint;
  c.token = kToken;
  c.retry.max_attempts = attempts;
  c.retry.initial_backoff = std::chrono::milliseconds(5);
  c.retry.max_backoff = std::chrono::milliseconds(50);
  c.retry.low_speed_time = std::chrono::seconds(2);
  c.chunk_bytes = std::size_t{256} << 10;
  return gcs::make_gcs_json_storage(c);
}

TEST(GcsFaultsTest, RangedReadsSurviveEveryFaultKind) {
  auto st = gcs_at(proxy().endpoint(), unique_name("faults"));
  read_through_every_fault(*st, proxy(), "obj");
}

TEST(GcsFaultsTest, ExhaustedRetriesFailInOneLineNamingTheObject) {
  auto st = gcs_at(proxy().endpoint(), unique_name("exhausted"), /*attempts=*/3);
  expect_exhausted_read_names_object(*st, proxy(), "reset.bin", "reset", "2 retries");
  expect_exhausted_read_names_object(*st, proxy(), "short.bin", "short206", "wrong range");
  expect_exhausted_read_names_object(*st, proxy(), "busy.bin", "429", "HTTP 429");
}

TEST(GcsFaultsTest, ResumableUploadThroughFaultsCommitsExactlyTheBytesWritten) {
  const std::string prefix = unique_name("upload");
  auto st = gcs_at(proxy().endpoint(), prefix);
  auto direct = gcs_at(server().endpoint(), prefix);
  const std::string data = pattern_bytes((std::size_t{1} << 20) + 3, 5);  // 5 chunks of 256 KiB
  // POST 1 opens the session, the PUTs are the 5 chunks and their retries; the reset answers
  // a chunk the server stored, which is sent again.
  proxy().set_faults("POST 1 1 503\nPUT 2 1 500\nPUT 4 1 429\nPUT 5 1 reset\n");
  const http::RetryCounts before = http::retry_counts();
  auto w = st->open_writer("big.bin");
  w->append(as_bytes(data));
  w->commit();
  const http::RetryCounts added = http::retry_counts_since(before, http::retry_counts());
  std::cout << "[resumable upload] " << http::describe_retry_counts(added) << "\n";
  EXPECT_EQ(proxy().faults(), (std::map<std::string, int>{{"503", 1}, {"500", 1}, {"429", 1}, {"reset", 1}}));
  EXPECT_EQ(added[http::RetryCause::kThrottled], 2u);
  EXPECT_EQ(added[http::RetryCause::kServerError], 1u);
  EXPECT_GE(added[http::RetryCause::kConnection] + added[http::RetryCause::kTruncated], 1u);
  proxy().set_faults("");
  std::string got(data.size(), '\0');
  direct->read("big.bin", 0, std::as_writable_bytes(std::span(got)));
  EXPECT_TRUE(got == data);
}

// Request bodies damaged on the way (the proxy's damagebody): the request that creates the
// object carries X-Goog-Hash (crc32c) of the whole object, which gcs_json_server.py checks
// as GCS does. A damaged media upload or last chunk is refused (400) and sent again: the
// object holds exactly the bytes written. An earlier chunk damaged is stored as received,
// so the last chunk is refused on every attempt: the upload fails in one line naming the
// object, and no object exists.
TEST(GcsFaultsTest, DamagedBodiesAreRefusedByTheObjectHash) {
  const std::string prefix = unique_name("damaged");
  auto st = gcs_at(proxy().endpoint(), prefix);
  auto direct = gcs_at(server().endpoint(), prefix);
  const std::string data = pattern_bytes((std::size_t{1} << 20) + 3, 17);  // 5 chunks of 256 KiB
  const std::string small = pattern_bytes(100000, 18);

  // POST 1 opens the session (no body: never damaged), PUT 1-5 are the chunks in order.
  expect_damaged_bodies_sent_again(*st, *direct, proxy(), "last-chunk.bin", data, /*atomic=*/false,
                                   "PUT 5 1 damagebody\n", 1);
  expect_damaged_bodies_sent_again(*st, *direct, proxy(), "media.bin", small, /*atomic=*/true, "POST 1 1 damagebody\n",
                                   1);

  expect_failed_write_leaves_nothing(*st, *direct, proxy(), "middle-chunk.bin", data, /*atomic=*/false,
                                     "PUT 2 1 damagebody\n", "doesn't match calculated CRC32C", "3 retries");
  expect_failed_write_leaves_nothing(*st, *direct, proxy(), "never-media.bin", small, /*atomic=*/true,
                                     "POST 1 0 damagebody\n", "doesn't match calculated CRC32C", "3 retries");
}

}  // namespace
}  // namespace shardpoint::storage::testing
