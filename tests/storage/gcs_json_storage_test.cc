// The gs:// driver on the GCS JSON API (bearer token) on 127.0.0.1, against two servers:
//   fsouza's fake-gcs-server (fake_gcs_server.h), the GCS emulator: the storage conformance
//   suite; resumable uploads in several 256 KiB chunks, parallel ranged reads, windowed
//   sources; engine save on 4 ranks and load on 2 over gs:// (registry);
//   tests/storage/gcs_json_server.py, this repository's server, kept only for what the
//   emulator cannot show: request and session counts (one fetch per window, sessions open
//   before commit and gone after), list pages of 3, a source refusing a replaced object
//   (fake-gcs-server ignores ifGenerationMatch on downloads), a wrong token refused
//   (fake-gcs-server accepts any), injected 503s and dropped connections (retried; an
//   aborted or failed upload publishes nothing and leaves no session). The tests of the
//   first group run on it too, with its counts checked.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "comm/thread_communicator.h"
#include "core/buffer_pool.h"
#include "engine/checkpoint_test_state.h"
#include "fake_gcs_server.h"
#include "gcs_json_server.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/gcs/gcs_json_storage.h"
#include "storage/memory_storage.h"
#include "storage_conformance.h"
#include "storage_test_util.h"
#include "test_util.h"

namespace shardpoint::storage::testing {
namespace {

using shardpoint::testing::unique_name;

constexpr const char* kToken = "ya29.sp-test-SECRET-token-0123456789";
constexpr std::size_t kChunk = std::size_t{256} << 10;

// This repository's server (fault controls, counters, token check).
GcsJsonServer& server() {
  static std::unique_ptr<GcsJsonServer> s = [] {
    std::string why;
    auto started = GcsJsonServer::start(kToken, {"sp-gcs-json"}, /*page_size=*/3, &why);
    if (!started) {
      std::cerr << why << "\n";
      std::abort();
    }
    return started;
  }();
  return *s;
}

// The servers the tests of the first group run on (the suffix of their names).
constexpr const char* kFakeGcs = "fake_gcs";
constexpr const char* kHomeServer = "test_server";

// The endpoint of server `kind`; "" after recording a skip (or failure under
// SHARDPOINT_REQUIRE_ORACLES=1) when fake-gcs-server is unavailable.
std::string endpoint_of(const std::string& kind) {
  if (kind == kHomeServer) return server().endpoint();
  std::string why;
  FakeGcsServer* fake = shared_fake_gcs(&why);  // bucket sp-gcs-json
  if (fake != nullptr) return fake->endpoint();
  if (::shardpoint::testing::oracles_required()) ADD_FAILURE() << why;
  return "";
}

// Small chunks and windows so a few MiB exercise every path; fast retries.
gcs::GcsJsonConfig config(const std::string& name, const std::string& token = kToken,
                          const std::string& endpoint = "") {
  gcs::GcsJsonConfig c;
  c.bucket = "sp-gcs-json";
  c.prefix = unique_name(name);
  c.endpoint = endpoint.empty() ? server().endpoint() : endpoint;
  c.token = token;
  c.retry.max_attempts = 4;
  c.retry.initial_backoff = std::chrono::milliseconds(5);
  c.chunk_bytes = kChunk;
  c.parallel_read_bytes = std::size_t{1} << 20;
  c.read_chunk_bytes = std::size_t{1} << 20;
  c.source_whole_bytes = 64 << 10;
  c.source_window_bytes = 128 << 10;
  return c;
}

std::shared_ptr<Storage> open_json(const std::string& name, const std::string& endpoint = "") {
  return gcs::make_gcs_json_storage(config(name, kToken, endpoint));
}

int sessions() { return server().state()["sessions"].get<int>(); }
int requests() { return server().state()["requests"].get<int>(); }

// Records the skip (or failure) for the running test; the placeholder storage is never used.
void skip_without_fake_gcs() { GTEST_SKIP() << "fake-gcs-server unavailable"; }

StorageUnderTest make_fake_gcs() {
  const std::string endpoint = endpoint_of(kFakeGcs);
  if (endpoint.empty()) {
    skip_without_fake_gcs();
    return {open_memory_storage(Location::parse("memory://"), {}), nullptr};
  }
  return {open_json("conformance", endpoint), nullptr};
}

INSTANTIATE_TEST_SUITE_P(GcsJson, StorageConformanceTest,
                         ::testing::Values(StorageFactory{"gcs_json_fake_gcs", &make_fake_gcs}), StorageFactoryName());

// The tests of the first group, on each server; `counted` when the server counts sessions.
class GcsServerTest : public ::testing::TestWithParam<std::string> {
 protected:
  bool counted() const { return GetParam() == kHomeServer; }
  // fake-gcs-server v1.56.1 ignores ifGenerationMatch on downloads (it serves the newest
  // generation; GCS answers 412), so only the test server shows a replaced object refused.
  bool checks_read_generation() const { return GetParam() == kHomeServer; }
};
INSTANTIATE_TEST_SUITE_P(Gcs, GcsServerTest, ::testing::Values(std::string(kFakeGcs), std::string(kHomeServer)),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST_P(GcsServerTest, ResumableUploadInChunksPublishesOnCommitOnly) {
  const std::string endpoint = endpoint_of(GetParam());
  if (endpoint.empty()) GTEST_SKIP() << "fake-gcs-server unavailable";
  auto st = open_json("resumable", endpoint);
  const std::string data = pattern(5 * kChunk + 12345, 1);
  auto w = st->open_writer("big.distcp");
  for (std::size_t at = 0; at < data.size(); at += 100000) {
    w->append(as_bytes(std::string_view(data).substr(at, 100000)));
  }
  if (counted()) {
    EXPECT_EQ(sessions(), 1);  // chunks went to a session...
  }
  EXPECT_FALSE(st->try_stat("big.distcp"));  // ...and nothing is visible yet
  w->commit();
  if (counted()) {
    EXPECT_EQ(sessions(), 0);
  }
  EXPECT_EQ(read_all(*st, "big.distcp"), data);
}

// A writer uploads each full chunk in the append() that needs its buffer again and holds one
// chunk buffer (GcsJsonConfig::overlap_chunks off, the default): when append() returns, the
// session holds every chunk but the one being filled. With overlap_chunks a chunk uploads
// while the next fills (two buffers). Either way the chunks are chunk_bytes, the last the rest.
TEST(GcsJsonStorageTest, ChunksUploadOneAtATimeFromOneBufferUnlessOverlapped) {
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlap_chunks" : "one buffer");
    BufferPoolOptions po;
    po.buffer_bytes = kChunk;
    po.capacity_bytes = 4 * kChunk;
    po.huge_pages = false;
    auto pool = std::make_shared<BufferPool>(po);
    StorageOptions options;
    options.buffer_pool = pool;
    gcs::GcsJsonConfig c = config("chunks");
    c.overlap_chunks = overlap;
    auto st = gcs::make_gcs_json_storage(c, options);
    const std::size_t chunks_before = server().state()["chunk_sizes"].size();
    const auto bytes_before = server().state()["session_bytes"].get<std::uint64_t>();
    const std::string data = pattern(4 * kChunk + 1000, 7);
    auto w = st->open_writer("chunks.distcp");
    for (std::size_t at = 0; at < data.size(); at += 100000) {
      w->append(as_bytes(std::string_view(data).substr(at, 100000)));
      if (overlap) continue;  // a chunk may still be uploading
      const std::uint64_t sent = (w->position() - 1) / kChunk * kChunk;
      EXPECT_EQ(server().state()["session_bytes"].get<std::uint64_t>() - bytes_before, sent) << w->position();
      EXPECT_EQ(pool->leased_buffers(), 1u) << w->position();
    }
    w->commit();
    const nlohmann::json all = server().state()["chunk_sizes"];
    std::vector<std::size_t> sizes;
    for (std::size_t i = chunks_before; i < all.size(); ++i) sizes.push_back(all[i].get<std::size_t>());
    EXPECT_EQ(sizes, (std::vector<std::size_t>{kChunk, kChunk, kChunk, kChunk, 1000}));
    EXPECT_LE(pool->allocated_buffers(), overlap ? 2u : 1u);
    EXPECT_EQ(pool->leased_buffers(), 0u);
    EXPECT_EQ(sessions(), 0);
    EXPECT_EQ(read_all(*st, "chunks.distcp"), data);
  }
}

// WriteOptions::if_absent on a resumable session: ifGenerationMatch=0 is checked when the
// session opens and again when its last chunk publishes (an object that appeared meanwhile).
// On the home-made server: it counts the sessions left open.
TEST(GcsJsonStorageTest, CreateOnlySessionsAreCheckedAtOpenAndAtTheLastChunk) {
  auto st = open_json("create-only");
  WriteOptions create_only;
  create_only.if_absent = true;
  const std::string data = pattern(3 * kChunk + 5, 7);
  auto w = st->open_writer(".metadata", create_only);
  w->append(as_bytes(std::string_view(data).substr(0, 2 * kChunk + 1)));  // the session is open
  EXPECT_EQ(sessions(), 1);
  const std::string other = "published by another writer meanwhile";
  st->write_atomic(".metadata", as_bytes(other));
  w->append(as_bytes(std::string_view(data).substr(2 * kChunk + 1)));
  try {
    w->commit();
    ADD_FAILURE() << "the create-only session published over another object";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kAlreadyExists) << e.what();
    EXPECT_NE(std::string(e.what()).find("HTTP 412"), std::string::npos) << e.what();
  }
  w.reset();
  EXPECT_EQ(read_all(*st, ".metadata"), other);
  EXPECT_EQ(sessions(), 0);

  // The object exists now: a new create-only session is refused when it opens.
  auto late = st->open_writer(".metadata", create_only);
  try {
    late->append(as_bytes(data));  // the first full chunk opens the session
    ADD_FAILURE() << "a create-only session opened over an object";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kAlreadyExists) << e.what();
  }
  late.reset();
  EXPECT_EQ(read_all(*st, ".metadata"), other);
  EXPECT_EQ(sessions(), 0);
}

TEST_P(GcsServerTest, ExactChunkMultiplesAndSmallObjects) {
  const std::string endpoint = endpoint_of(GetParam());
  if (endpoint.empty()) GTEST_SKIP() << "fake-gcs-server unavailable";
  auto st = open_json("sizes", endpoint);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, kChunk - 1, kChunk, kChunk + 1, 2 * kChunk, 3 * kChunk}) {
    const std::string key = "o" + std::to_string(n);
    const std::string data = pattern(n, static_cast<std::uint32_t>(n));
    auto w = st->open_writer(key);
    w->append(as_bytes(data));
    w->commit();
    EXPECT_EQ(read_all(*st, key), data) << n;
  }
  if (counted()) {
    EXPECT_EQ(sessions(), 0);
  }
}

TEST_P(GcsServerTest, ParallelRangedReadsAndPastTheEnd) {
  const std::string endpoint = endpoint_of(GetParam());
  if (endpoint.empty()) GTEST_SKIP() << "fake-gcs-server unavailable";
  auto st = open_json("ranges", endpoint);
  const std::string data = pattern((5 << 20) + 7, 2);
  st->write_atomic("x", as_bytes(data));
  std::string got(data.size() - 100, '\0');  // > parallel_read_bytes: 5 GETs at once
  st->read("x", 100, std::as_writable_bytes(std::span(got)));
  EXPECT_EQ(got, data.substr(100));
  std::string tail(8, '\0');
  EXPECT_THROW(st->read("x", data.size() - 4, std::as_writable_bytes(std::span(tail))), FormatError);
  EXPECT_THROW(st->read("x", data.size() + 4, std::as_writable_bytes(std::span(tail))), FormatError);
}

TEST_P(GcsServerTest, SourceReadsWindowsOfTheGenerationItOpened) {
  const std::string endpoint = endpoint_of(GetParam());
  if (endpoint.empty()) GTEST_SKIP() << "fake-gcs-server unavailable";
  auto st = open_json("source", endpoint);
  const std::string data = pattern(1 << 20, 3);
  st->write_atomic("blob", as_bytes(data));
  auto source = st->open_source("blob");
  const int before = counted() ? requests() : 0;
  std::string small(100, '\0');
  for (std::uint64_t at = 0; at < 100000; at += 1000) {  // all inside the first 128 KiB window
    source->read(at, std::as_writable_bytes(std::span(small)), "test");
    ASSERT_EQ(small, data.substr(at, 100));
  }
  if (counted()) {
    EXPECT_EQ(requests() - before, 1);
  }
  if (!checks_read_generation()) return;
  st->write_atomic("blob", as_bytes(pattern(1 << 20, 4)));  // replaced: a new generation
  try {
    source->read(900000, std::as_writable_bytes(std::span(small)), "test");
    FAIL() << "read a replaced object";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("changed since it was opened"), std::string::npos) << e.what();
  }
}

TEST(GcsJsonStorageTest, ThreadsMissingOnOneWindowShareOneFetch) {
  auto st = open_json("window-threads");
  const std::string data = pattern(1 << 20, 7);
  st->write_atomic("blob", as_bytes(data));
  auto source = st->open_source("blob");
  const int before = requests();
  std::vector<std::jthread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::string got(1000, '\0');
      const std::uint64_t at = 200000 + 1000 * static_cast<std::uint64_t>(t);
      source->read(at, std::as_writable_bytes(std::span(got)), "test");
      if (got != data.substr(at, 1000)) ++wrong;
    });
  }
  threads.clear();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(requests() - before, 1);  // one 128 KiB window, fetched once
}

TEST(GcsJsonStorageTest, ListFollowsPageTokensAndNamesAreOneEncodedSegment) {
  auto st = open_json("list");
  std::vector<std::string> keys = {"a b/c+d=e", "a b/%41",           "step=3/__0_0.distcp",
                                   "x/y/z",     "\xc3\xa9t\xc3\xa9", "plain"};
  for (int i = 0; i < 5; ++i) keys.push_back("many/" + std::to_string(i));
  for (const auto& k : keys) st->write_atomic(k, as_bytes(k));
  std::sort(keys.begin(), keys.end());
  const int before = requests();
  auto listed = st->list("");
  EXPECT_GE(requests() - before, 4);  // 11 objects in pages of 3
  ASSERT_EQ(listed.size(), keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(listed[i].key, keys[i]);
    EXPECT_EQ(listed[i].size, keys[i].size());
    EXPECT_EQ(read_all(*st, keys[i]), keys[i]);
  }
  EXPECT_EQ(st->list("a b/").size(), 2u);
  EXPECT_EQ(st->remove_prefix("many/"), 5u);
  EXPECT_EQ(st->list("").size(), keys.size() - 5);
}

TEST(GcsJsonStorageTest, AWrongTokenIsOnePermissionErrorThatNeverShowsTheToken) {
  const std::string wrong = "ya29.WRONG-secret-token";
  auto st = gcs::make_gcs_json_storage(config("auth", wrong));
  const int before = requests();
  try {
    st->write_atomic("k", as_bytes(std::string("x")));
    FAIL() << "a wrong token was accepted";
  } catch (const StorageError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), StorageError::Kind::kPermission) << msg;
    EXPECT_NE(msg.find("gs://sp-gcs-json/auth-"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HTTP 401"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GOOGLE_OAUTH_ACCESS_TOKEN"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(wrong), std::string::npos) << msg;
    EXPECT_EQ(msg.find("WRONG-secret"), std::string::npos) << msg;
  }
  EXPECT_EQ(requests() - before, 1);  // 401 is not retried
  EXPECT_THROW(st->stat("k"), StorageError);
}

TEST(GcsJsonStorageTest, Retries503AndDroppedConnections) {
  auto st = open_json("retry");
  const std::string data = pattern(3 * kChunk + 5, 5);
  server().inject_fault("503", 2, "uploadType=media");
  st->write_atomic("a", as_bytes(data));
  server().inject_fault("drop", 2, "upload_id=");  // chunk PUTs of a session
  auto w = st->open_writer("b");
  w->append(as_bytes(data));
  w->commit();
  server().inject_fault("503", 3, "/download/");
  EXPECT_EQ(read_all(*st, "a"), data);
  server().inject_fault("drop", 1, "/download/");
  EXPECT_EQ(read_all(*st, "b"), data);
  // More failures than attempts: a transient error naming the object and the retries.
  server().inject_fault("503", 10, "/download/");
  try {
    read_all(*st, "a");
    FAIL() << "read succeeded through 10 failures";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kTransient) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 retries"), std::string::npos) << e.what();
  }
  server().inject_fault("503", 0);  // clear what is left
}

TEST(GcsJsonStorageTest, AnAbortedUploadLeavesNothing) {
  auto st = open_json("abort");
  const std::string data = pattern(4 * kChunk, 6);
  {
    auto w = st->open_writer("gone");
    w->append(as_bytes(data));
    EXPECT_EQ(sessions(), 1);
  }  // destroyed without commit: the session is cancelled
  EXPECT_EQ(sessions(), 0);
  EXPECT_FALSE(st->try_stat("gone"));
  // A commit whose chunks keep failing: the error names the object; no session, no object.
  {
    auto w = st->open_writer("failed");
    w->append(as_bytes(data));
    server().inject_fault("503", 100, "PUT /upload/");
    try {
      w->commit();
      FAIL() << "commit succeeded through failures";
    } catch (const StorageError& e) {
      EXPECT_NE(std::string(e.what()).find("gs://sp-gcs-json/abort-"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("upload_id"), std::string::npos) << e.what();
    }
    server().inject_fault("503", 0);
  }
  EXPECT_EQ(sessions(), 0);
  EXPECT_FALSE(st->try_stat("failed"));
  EXPECT_TRUE(st->list("").empty());
}

// --- engine over gs:// opened through the registry (the bearer-token path of gcs_storage.cc) ---

using engine::testing::compare_with_expected;
using engine::testing::make_rank_state;
using engine::testing::RankState;

// The variables open_storage() reads for gs:// on the JSON API, pointed at `endpoint`.
void export_json_environment(const std::string& endpoint) {
  ::unsetenv("GCS_HMAC_ACCESS_ID");
  ::unsetenv("GCS_HMAC_SECRET");
  ::setenv("GOOGLE_OAUTH_ACCESS_TOKEN", kToken, 1);
  ::setenv("GCS_JSON_ENDPOINT_URL", endpoint.c_str(), 1);
  ::setenv("SHARDPOINT_HTTP_MAX_ATTEMPTS", "4", 1);
  ::setenv("SHARDPOINT_HTTP_BACKOFF_MS", "5", 1);
}

// On gcs_json_server.py (its fault controls).
class GcsJsonEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { export_json_environment(server().endpoint()); }
};

// On each server.
class GcsEngineTest : public GcsServerTest {};
INSTANTIATE_TEST_SUITE_P(Gcs, GcsEngineTest, ::testing::Values(std::string(kFakeGcs), std::string(kHomeServer)),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

comm::CommOptions fast() { return comm::CommOptions{std::chrono::seconds(60)}; }

TEST_P(GcsEngineTest, SaveOn4LoadOn2) {
  const std::string endpoint = endpoint_of(GetParam());
  if (endpoint.empty()) GTEST_SKIP() << "fake-gcs-server unavailable";
  export_json_environment(endpoint);
  auto st = open_storage("gs://sp-gcs-json/" + unique_name("ckpt"));
  {
    std::vector<RankState> states;
    for (int r = 0; r < 4; ++r) states.push_back(make_rank_state(r, 4, true));
    comm::ThreadGroup group(4, fast());
    group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });
  }
  EXPECT_TRUE(st->try_stat(".metadata"));
  for (int world : {2, 4}) {
    std::vector<RankState> states;
    for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, false));
    comm::ThreadGroup group(world, fast());
    group.run([&](comm::Communicator& comm) { engine::load(states[comm.rank()].root, *st, comm); });
    for (int r = 0; r < world; ++r) EXPECT_EQ(compare_with_expected(states[r], r, world), "") << "rank " << r;
  }
  if (counted()) {
    EXPECT_EQ(sessions(), 0);
  }
}

// An object store (features().object_store; a resumable session takes one chunk at a time),
// so a save writes at least 4 objects per rank on gs://: as many upload streams per rank.
TEST_P(GcsEngineTest, SaveWritesAtLeastFourObjectsPerRank) {
  const std::string endpoint = endpoint_of(GetParam());
  if (endpoint.empty()) GTEST_SKIP() << "fake-gcs-server unavailable";
  export_json_environment(endpoint);
  for (int threads : {1, 6}) {
    auto st = open_storage("gs://sp-gcs-json/" + unique_name("files"));
    ASSERT_TRUE(st->features().object_store);
    std::vector<RankState> states;
    states.reserve(2);
    for (int r = 0; r < 2; ++r) states.push_back(make_rank_state(r, 2, true));
    engine::SaveOptions options;
    options.thread_count = threads;
    std::vector<std::vector<std::string>> files(2);
    comm::ThreadGroup group(2, fast());
    group.run([&](comm::Communicator& comm) {
      files[comm.rank()] = engine::save(states[comm.rank()].root, *st, comm, options).files;
    });
    const std::size_t expected = threads < 4 ? 4 : static_cast<std::size_t>(threads);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(files[r].size(), expected) << "rank " << r << ", thread_count " << threads;
      std::size_t listed = 0;
      for (const ObjectInfo& o : st->list("")) listed += o.key.starts_with("__" + std::to_string(r) + "_") ? 1 : 0;
      EXPECT_EQ(listed, expected) << "rank " << r << ", thread_count " << threads;
    }
    std::vector<RankState> loaded;
    loaded.reserve(2);
    for (int r = 0; r < 2; ++r) loaded.push_back(make_rank_state(r, 2, false));
    comm::ThreadGroup load_group(2, fast());
    load_group.run([&](comm::Communicator& comm) { engine::load(loaded[comm.rank()].root, *st, comm); });
    for (int r = 0; r < 2; ++r) EXPECT_EQ(compare_with_expected(loaded[r], r, 2), "") << "rank " << r;
  }
  if (counted()) EXPECT_EQ(sessions(), 0);
}

TEST_F(GcsJsonEngineTest, AFailedSaveLeavesNoMetadataAndNoSession) {
  auto st = open_storage("gs://sp-gcs-json/" + unique_name("failed"));
  std::vector<RankState> states;
  for (int r = 0; r < 4; ++r) states.push_back(make_rank_state(r, 4, true));
  server().inject_fault("503", 1000,
                        "uploadType=media&name=" + st->url().substr(std::string("gs://sp-gcs-json/").size()));
  comm::ThreadGroup group(4, fast());
  EXPECT_ANY_THROW(group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); }));
  server().inject_fault("503", 0);
  EXPECT_FALSE(st->try_stat(".metadata"));
  EXPECT_EQ(sessions(), 0);
}

TEST_P(GcsEngineTest, UrlOptionsAndTheTokenStaysOutOfUrl) {
  const std::string endpoint = endpoint_of(GetParam());
  if (endpoint.empty()) GTEST_SKIP() << "fake-gcs-server unavailable";
  export_json_environment(endpoint);
  auto st = open_storage("gs://sp-gcs-json/" + unique_name("url"));
  EXPECT_TRUE(st->url().starts_with("gs://sp-gcs-json/url-")) << st->url();
  EXPECT_EQ(st->url().find(kToken), std::string::npos);
  EXPECT_TRUE(st->features().atomic_publish);
  EXPECT_TRUE(st->features().range_reads);
  EXPECT_TRUE(st->features().object_store);
  EXPECT_THROW(open_storage("gs://sp-gcs-json/p?token=x"), UsageError);
}

}  // namespace
}  // namespace shardpoint::storage::testing
