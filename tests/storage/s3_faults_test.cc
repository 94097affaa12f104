// The S3 driver against moto through fault_proxy.py (faults from servers, issue 15 item 4):
// ranged reads survive every fault kind with the exact bytes, each fault met by a retry on a
// new connection counted under its cause; exhausted retries fail in one line naming the
// object; a multipart upload through faults commits exactly the bytes written, and one whose
// completion always fails leaves no object; bodies damaged on the way are refused and sent
// again; opening an object for its first bytes is one GET; engine save and load through faults are bit-identical;
// `shardpoint verify
// --verbose` through faults reports its retries.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/thread_communicator.h"
#include "engine/checkpoint_test_state.h"
#include "fault_proxy.h"
#include "s3_servers.h"
#include "server_faults.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "storage/s3/s3_storage.h"
#include "test_util.h"

namespace shardpoint::storage::testing {
namespace {

using shardpoint::testing::unique_name;

// One proxy in front of the binary's moto, started at first use.
FaultProxy* shared_proxy(const S3TestServer& moto) {
  static std::unique_ptr<FaultProxy> proxy = [&] {
    std::string why;
    auto p = FaultProxy::start(moto.endpoint(), /*slow_seconds=*/3.5, &why);
    if (!p) std::cerr << why << "\n";
    return p;
  }();
  return proxy.get();
}

// Fast retries, and a 2 s low-speed limit so the proxy's 3.5 s "slow" answers time out.
http::RetryPolicy test_policy(int attempts) {
  http::RetryPolicy p;
  p.max_attempts = attempts;
  p.initial_backoff = std::chrono::milliseconds(5);
  p.max_backoff = std::chrono::milliseconds(50);
  p.low_speed_time = std::chrono::seconds(2);
  return p;
}

// s3://sp-test/<prefix> with its requests sent to `endpoint` (the proxy, or moto itself);
// with Content-MD5 on every body when content_md5 (as the gs:// XML driver sends).
std::unique_ptr<Storage> s3_at(const std::string& endpoint, const std::string& prefix, int attempts = 4,
                               bool content_md5 = false,
                               s3::S3Config::PayloadSigning signing = s3::S3Config::PayloadSigning::kAuto) {
  s3::S3Config config = s3::s3_config(Location::parse("s3://sp-test/" + prefix));
  config.endpoint = endpoint;
  config.path_style = true;
  config.retry = test_policy(attempts);
  config.part_bytes = std::size_t{5} << 20;
  config.content_md5 = content_md5;
  config.payload_signing = signing;
  return s3::make_s3_storage(config);
}

// moto (skipped without it, as every moto test) with the proxy in front.
class S3FaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SP_REQUIRE_MOTO(moto);
    moto_ = moto;
    proxy_ = shared_proxy(*moto);
    ASSERT_NE(proxy_, nullptr) << "fault_proxy.py did not start";
  }

  S3TestServer* moto_ = nullptr;
  FaultProxy* proxy_ = nullptr;
};

TEST_F(S3FaultsTest, RangedReadsSurviveEveryFaultKind) {
  auto st = s3_at(proxy_->endpoint(), unique_name("faults"));
  read_through_every_fault(*st, *proxy_, "obj");
}

// open_source() for a caller that reads the object's first bytes first is one ranged GET of
// them (64 KiB at least), no HEAD: an object they cover comes whole; a larger one keeps them
// as its first block and pins the ETag of that answer; an empty one (416 to any range) and a
// missing one are told apart by a HEAD. Without that hint a HEAD opens the object.
TEST_F(S3FaultsTest, OpeningForTheFirstBytesIsOneGet) {
  auto st = s3_at(proxy_->endpoint(), unique_name("open"));
  const std::string small = pattern_bytes(1000, 1);
  const std::string large = pattern_bytes((std::size_t{3} << 20) + 5, 2);
  st->write_atomic("small", as_bytes(small));
  st->write_atomic("large", as_bytes(large));
  st->write_atomic("empty", {});
  const auto requests = [&](const char* selector) { return proxy_->stats()["requests"].value(selector, 0); };
  const auto read = [](const ByteSource& source, std::uint64_t at, std::size_t n) {
    std::string out(n, '\0');
    source.read(at, std::as_writable_bytes(std::span(out)), "test");
    return out;
  };

  SourceOptions first_bytes;
  first_bytes.first_read_bytes = 100;
  proxy_->set_faults("RGET 1 1 short206\n");  // the opening GET is retried like any other
  std::unique_ptr<ByteSource> source = st->open_source("small", first_bytes);
  EXPECT_EQ(source->size(), small.size());
  EXPECT_EQ(read(*source, 0, small.size()), small);
  EXPECT_EQ(requests("GET"), 2) << proxy_->stats().dump();
  EXPECT_EQ(requests("HEAD"), 0) << proxy_->stats().dump();

  proxy_->set_faults("");
  source = st->open_source("large", first_bytes);
  EXPECT_EQ(source->size(), large.size());
  EXPECT_EQ(read(*source, 0, 1000), large.substr(0, 1000));
  EXPECT_EQ(read(*source, (64 << 10) - 10, 10), large.substr((64 << 10) - 10, 10));
  EXPECT_EQ(requests("GET"), 1) << proxy_->stats().dump();  // the first 64 KiB came with the open
  EXPECT_EQ(read(*source, 2 << 20, 100), large.substr(2 << 20, 100));
  EXPECT_EQ(requests("GET"), 2) << proxy_->stats().dump();
  EXPECT_EQ(requests("HEAD"), 0) << proxy_->stats().dump();
  // As far as the caller said it reads first (under 1 MiB): a 300 KiB first block.
  SourceOptions first_300k;
  first_300k.first_read_bytes = 300 << 10;
  proxy_->set_faults("");
  source = st->open_source("large", first_300k);
  EXPECT_EQ(read(*source, (300 << 10) - 10, 10), large.substr((300 << 10) - 10, 10));
  EXPECT_EQ(requests("GET"), 1) << proxy_->stats().dump();
  // Replaced after the open: a read beyond the first block sees another ETag.
  std::unique_ptr<ByteSource> pinned = st->open_source("large", first_bytes);
  const std::string replaced = pattern_bytes(large.size(), 3);
  st->write_atomic("large", as_bytes(replaced));
  EXPECT_EQ(read(*pinned, 0, 100), large.substr(0, 100));
  try {
    read(*pinned, 3 << 20, 5);
    ADD_FAILURE() << "read a replaced object";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("changed since it was opened"), std::string::npos) << e.what();
  }

  EXPECT_EQ(st->open_source("empty", first_bytes)->size(), 0u);
  try {
    st->open_source("missing", first_bytes);
    ADD_FAILURE() << "opened a missing object";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kNotFound) << e.what();
  }

  proxy_->set_faults("");
  EXPECT_EQ(read(*st->open_source("large"), 10, 10), replaced.substr(10, 10));
  EXPECT_EQ(requests("HEAD"), 1) << proxy_->stats().dump();
  EXPECT_EQ(requests("GET"), 1) << proxy_->stats().dump();
}

TEST_F(S3FaultsTest, ExhaustedRetriesFailInOneLineNamingTheObject) {
  auto st = s3_at(proxy_->endpoint(), unique_name("exhausted"), /*attempts=*/3);
  expect_exhausted_read_names_object(*st, *proxy_, "reset.bin", "reset", "2 retries");
  expect_exhausted_read_names_object(*st, *proxy_, "garbage.bin", "garbage", "malformed response");
  expect_exhausted_read_names_object(*st, *proxy_, "wrong.bin", "wrongrange", "wrong range");
  expect_exhausted_read_names_object(*st, *proxy_, "slowdown.bin", "503", "HTTP 503 SlowDown");
}

TEST_F(S3FaultsTest, MultipartUploadThroughFaultsCommitsExactlyTheBytesWritten) {
  const std::string prefix = unique_name("multipart");
  auto st = s3_at(proxy_->endpoint(), prefix);
  auto direct = s3_at(moto_->endpoint(), prefix);
  const std::string data = pattern_bytes((std::size_t{11} << 20) + 5, 11);  // 3 parts of 5 MiB

  // POST 1 starts the upload, PUT 1-3 are the parts, POST 2 completes it. A reset answer to a
  // part the server stored is retried (a part upload is idempotent).
  proxy_->set_faults("POST 1 1 503\nPUT 2 1 reset\nPUT 3 1 500\nPOST 2 1 503\n");
  const http::RetryCounts before = http::retry_counts();
  auto w = st->open_writer("big.bin");
  w->append(as_bytes(data));
  w->commit();
  const http::RetryCounts added = http::retry_counts_since(before, http::retry_counts());
  std::cout << "[multipart upload] " << http::describe_retry_counts(added) << "\n";
  EXPECT_EQ(proxy_->faults(), (std::map<std::string, int>{{"503", 2}, {"reset", 1}, {"500", 1}}));
  EXPECT_EQ(added[http::RetryCause::kThrottled], 2u);
  EXPECT_EQ(added[http::RetryCause::kServerError], 1u);
  EXPECT_GE(added[http::RetryCause::kConnection] + added[http::RetryCause::kTruncated], 1u);
  std::string got(data.size(), '\0');
  direct->read("big.bin", 0, std::as_writable_bytes(std::span(got)));
  EXPECT_TRUE(got == data);

  // Completion refused on every attempt: the writer fails naming the object, and no object
  // (corrupt or partial) appears.
  proxy_->set_faults("POST 2 0 500\n");
  auto failing = st->open_writer("never.bin");
  failing->append(as_bytes(data));
  try {
    failing->commit();
    ADD_FAILURE() << "commit succeeded although completion always failed";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find(st->describe_key("never.bin")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HTTP 500 InternalError"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 retries"), std::string::npos) << e.what();
    std::cout << "[completion exhausted] " << e.what() << "\n";
  }
  proxy_->set_faults("");
  EXPECT_FALSE(direct->try_stat("never.bin"));
}

// Request bodies damaged on the way (the proxy's damagebody): the server refuses each by
// its signed x-amz-content-sha256 (XAmzContentSHA256Mismatch; moto through
// s3_moto_server.py's check, as S3), or by its Content-MD5 (BadDigest) when the driver sends
// one, or by its x-amz-checksum-crc32c (BadDigest) when it goes as UNSIGNED-PAYLOAD; the
// driver sends it again and the object holds exactly the bytes written. Damaged
// on every attempt, the write fails in one line naming the object and leaves no object.
TEST_F(S3FaultsTest, DamagedBodiesAreRefusedAndSentAgain) {
  const std::string prefix = unique_name("damaged");
  auto st = s3_at(proxy_->endpoint(), prefix);
  auto direct = s3_at(moto_->endpoint(), prefix);
  const std::string data = pattern_bytes((std::size_t{11} << 20) + 3, 13);  // 3 parts of 5 MiB
  const std::string small = pattern_bytes(100000, 14);

  // PUT 1-3 are the parts (in parallel: any order) and their retries.
  expect_damaged_bodies_sent_again(*st, *direct, *proxy_, "parts.bin", data, /*atomic=*/false,
                                   "PUT 1 1 damagebody\nPUT 3 1 damagebody\n", 2);
  expect_damaged_bodies_sent_again(*st, *direct, *proxy_, "put.bin", small, /*atomic=*/true, "PUT 1 1 damagebody\n", 1);
  auto md5 = s3_at(proxy_->endpoint(), prefix, 4, /*content_md5=*/true);
  expect_damaged_bodies_sent_again(*md5, *direct, *proxy_, "md5-parts.bin", data, /*atomic=*/false,
                                   "PUT 2 1 damagebody\n", 1);
  expect_damaged_bodies_sent_again(*md5, *direct, *proxy_, "md5-put.bin", small, /*atomic=*/true,
                                   "PUT 1 1 damagebody\n", 1);

  expect_failed_write_leaves_nothing(*st, *direct, *proxy_, "never-parts.bin", data, /*atomic=*/false,
                                     "PUT 1 0 damagebody\n", "HTTP 400 XAmzContentSHA256Mismatch", "3 retries");
  expect_failed_write_leaves_nothing(*st, *direct, *proxy_, "never-put.bin", small, /*atomic=*/true,
                                     "PUT 1 0 damagebody\n", "HTTP 400 XAmzContentSHA256Mismatch", "3 retries");
  expect_failed_write_leaves_nothing(*md5, *direct, *proxy_, "never-md5.bin", small, /*atomic=*/true,
                                     "PUT 1 0 damagebody\n", "HTTP 400 BadDigest", "3 retries");

  // UNSIGNED-PAYLOAD bodies are refused by their x-amz-checksum-crc32c (BadDigest, where a
  // signed one gets XAmzContentSHA256Mismatch) and sent again alike.
  auto crc_only = s3_at(proxy_->endpoint(), prefix, 4, false, s3::S3Config::PayloadSigning::kUnsigned);
  expect_damaged_bodies_sent_again(*crc_only, *direct, *proxy_, "unsigned-parts.bin", data, /*atomic=*/false,
                                   "PUT 2 1 damagebody\n", 1);
  expect_damaged_bodies_sent_again(*crc_only, *direct, *proxy_, "unsigned-put.bin", small, /*atomic=*/true,
                                   "PUT 1 1 damagebody\n", 1);
  expect_failed_write_leaves_nothing(*crc_only, *direct, *proxy_, "never-unsigned.bin", small, /*atomic=*/true,
                                     "PUT 1 0 damagebody\n", "HTTP 400 BadDigest", "3 retries");
}

// A part of borrowed pieces (Request::body_pieces) whose attempt fails part-way (a reset
// connection, a damaged body, a 500) goes again whole from its first piece, and the object
// holds exactly the bytes written.
TEST_F(S3FaultsTest, PartsOfBorrowedPiecesAreSentAgainWholeAfterAFault) {
  const std::string prefix = unique_name("borrowed");
  auto st = s3_at(proxy_->endpoint(), prefix);
  auto direct = s3_at(moto_->endpoint(), prefix);
  const std::string tensors = pattern_bytes((std::size_t{11} << 20) + 7, 15);
  proxy_->set_faults("PUT 1 1 reset\nPUT 2 1 damagebody\nPUT 3 1 500\n");
  std::string expected;
  auto w = st->open_writer("pieces.bin");
  for (std::size_t at = 0, n = 0; at < tensors.size(); ++n) {
    const std::string header = pattern_bytes(100, static_cast<int>(n));
    w->append(as_bytes(header));
    const std::string_view span = std::string_view(tensors).substr(at, std::size_t{700} << 10);
    w->append_borrowed(as_bytes(span));
    expected += header;
    expected += span;
    at += span.size();
  }
  w->commit();
  EXPECT_EQ(proxy_->faults(), (std::map<std::string, int>{{"reset", 1}, {"damagebody", 1}, {"500", 1}}));
  proxy_->set_faults("");
  std::string got(expected.size(), '\0');
  direct->read("pieces.bin", 0, std::as_writable_bytes(std::span(got)));
  EXPECT_TRUE(got == expected);
}

// The answer to CompleteMultipartUpload is lost after the server completed the upload, and
// the retry gets S3's NoSuchUpload (moto would complete again; real S3 does not): the writer
// recognises its own object by the multipart ETag of its parts and commits. Where the object
// at the key is not the one its parts make (none, or another writer's), the commit fails.
TEST_F(S3FaultsTest, CompletionWhoseAnswerWasLostIsRecognisedByItsETag) {
  const std::string prefix = unique_name("lostcomplete");
  auto st = s3_at(proxy_->endpoint(), prefix);
  auto direct = s3_at(moto_->endpoint(), prefix);
  const std::string data = pattern_bytes((std::size_t{11} << 20) + 7, 5);  // 3 parts of 5 MiB

  // POST 1 starts the upload, POST 2 completes it (answer lost), POST 3 is the retry.
  proxy_->set_faults("POST 2 1 lost\nPOST 3 1 nosuchupload\n");
  auto w = st->open_writer("lost.bin");
  w->append(as_bytes(data));
  w->commit();
  EXPECT_EQ(proxy_->faults(), (std::map<std::string, int>{{"lost", 1}, {"nosuchupload", 1}}));
  std::string got(data.size(), '\0');
  direct->read("lost.bin", 0, std::as_writable_bytes(std::span(got)));
  EXPECT_TRUE(got == data);

  // The completion never happened (a 500, then NoSuchUpload): no object, the commit fails.
  proxy_->set_faults("POST 2 1 500\nPOST 3 1 nosuchupload\n");
  auto never = st->open_writer("never.bin");
  never->append(as_bytes(data));
  EXPECT_THROW(never->commit(), StorageError);
  EXPECT_FALSE(direct->try_stat("never.bin"));

  // Another writer's object is at the key: its ETag is not ours, the commit fails and the
  // other object stays.
  const std::string other = pattern_bytes((std::size_t{11} << 20) + 7, 6);
  auto theirs = direct->open_writer("taken.bin");
  theirs->append(as_bytes(other));
  theirs->commit();
  proxy_->set_faults("POST 2 1 500\nPOST 3 1 nosuchupload\n");
  auto mine = st->open_writer("taken.bin");
  mine->append(as_bytes(data));
  try {
    mine->commit();
    ADD_FAILURE() << "commit succeeded although the object at the key is another writer's";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("NoSuchUpload"), std::string::npos) << e.what();
  }
  std::string kept(other.size(), '\0');
  direct->read("taken.bin", 0, std::as_writable_bytes(std::span(kept)));
  EXPECT_TRUE(kept == other);
  proxy_->set_faults("");
}

TEST_F(S3FaultsTest, SaveAndLoadThroughFaultsAreBitIdentical) {
  auto st = s3_at(proxy_->endpoint(), unique_name("ckpt"));
  constexpr int kWorld = 2;
  // A save of 2 ranks sends 6 PUTs (data files, sidecar, index, .metadata) and DELETEs of
  // what an older checkpoint could have left.
  proxy_->set_faults("PUT 2 1 503\nPUT 4 1 reset\nPUT 6 1 garbage\nDELETE 1 1 500\n");
  http::RetryCounts before = http::retry_counts();
  {
    std::vector<engine::testing::RankState> states;
    states.reserve(kWorld);
    for (int r = 0; r < kWorld; ++r) states.push_back(engine::testing::make_rank_state(r, kWorld, true));
    comm::ThreadGroup group(kWorld, comm::CommOptions{std::chrono::seconds(60)});
    group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });
  }
  http::RetryCounts added = http::retry_counts_since(before, http::retry_counts());
  std::cout << "[save] faults " << proxy_->stats()["faults"].dump() << "; " << http::describe_retry_counts(added)
            << "\n";
  EXPECT_GE(added.total(), 4u);  // one retry per fault at least
  EXPECT_EQ(added.exhausted, 0u);
  EXPECT_EQ(proxy_->faults(), (std::map<std::string, int>{{"503", 1}, {"reset", 1}, {"garbage", 1}, {"500", 1}}))
      << proxy_->stats().dump();

  proxy_->set_faults("RGET 1 1 overlong\nRGET 3 1 truncate\nRGET 5 1 short206\nRGET 7 1 reset\nRGET 9 1 longbody\n"
                     "RGET 10 1 garbage\n");
  before = http::retry_counts();
  std::vector<engine::testing::RankState> states;
  states.reserve(kWorld);
  for (int r = 0; r < kWorld; ++r) states.push_back(engine::testing::make_rank_state(r, kWorld, false));
  comm::ThreadGroup group(kWorld, comm::CommOptions{std::chrono::seconds(60)});
  group.run([&](comm::Communicator& comm) { engine::load(states[comm.rank()].root, *st, comm); });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(engine::testing::compare_with_expected(states[r], r, kWorld), "");
  added = http::retry_counts_since(before, http::retry_counts());
  std::cout << "[load] faults " << proxy_->stats()["faults"].dump() << "; " << http::describe_retry_counts(added)
            << "\n";
  // A 2-rank load makes more than 10 ranged GETs (and no HEAD: small objects and first bytes
  // are opened by a GET): every scheduled fault happens.
  EXPECT_EQ(proxy_->faults(),
            (std::map<std::string, int>{
                {"overlong", 1}, {"truncate", 1}, {"short206", 1}, {"reset", 1}, {"longbody", 1}, {"garbage", 1}}))
      << proxy_->stats().dump();
  EXPECT_EQ(proxy_->stats()["requests"].value("HEAD", 0), 0) << proxy_->stats().dump();
  EXPECT_GE(added.total(), proxy_->faults().size() - 1);  // junk after a body may go unread
  EXPECT_EQ(added.exhausted, 0u);
  proxy_->set_faults("");
}

TEST_F(S3FaultsTest, VerboseCliReportsRetriesAndExhaustedRetriesNameTheObject) {
  const std::string prefix = unique_name("cli");
  {
    proxy_->set_faults("");
    auto st = s3_at(moto_->endpoint(), prefix);
    std::vector<engine::testing::RankState> states;
    states.push_back(engine::testing::make_rank_state(0, 1, true));
    comm::ThreadGroup group(1, comm::CommOptions{std::chrono::seconds(60)});
    group.run([&](comm::Communicator& comm) { engine::save(states[0].root, *st, comm); });
  }
  // The CLI opens s3:// through the registry: the proxy becomes its endpoint.
  const std::string cli = "AWS_ENDPOINT_URL='" + proxy_->endpoint() + "' SHARDPOINT_HTTP_BACKOFF_MS=5 '" +
                          std::string(SP_SHARDPOINT) + "' verify s3://sp-test/" + prefix;

  proxy_->set_faults("RGET 1 1 truncate\nRGET 2 1 503\nHEAD 1 1 garbage\n");
  auto ok = shardpoint::testing::run_command(cli + " --verbose 2>&1");
  std::cout << "[cli] " << ok.output;
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("ok: "), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("shardpoint: http: 3 retries ("), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("1 throttled"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("1 truncated body"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("1 malformed response"), std::string::npos) << ok.output;
  EXPECT_EQ(proxy_->faults().size(), 3u);

  // Without --verbose nothing is added; every read broken: one error line naming the object.
  proxy_->set_faults("RGET 1 0 reset\n");
  auto failed = shardpoint::testing::run_command(cli + " 2>&1");
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  EXPECT_EQ(failed.output.find("http: "), std::string::npos) << failed.output;
  ASSERT_FALSE(failed.output.empty());
  std::cout << "[cli exhausted] " << failed.output;
  EXPECT_NE(failed.output.find("s3://sp-test/" + prefix + "/"), std::string::npos) << failed.output;
  EXPECT_NE(failed.output.find("retries)"), std::string::npos) << failed.output;
  proxy_->set_faults("");
}

}  // namespace
}  // namespace shardpoint::storage::testing
