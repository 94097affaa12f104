// What the big S3 clients do that the s3 driver does too (issue 16 item 3), on each S3 test
// server (s3_servers.h: moto and s3s-fs): a create-only `.metadata` commit (If-None-Match: * on
// PutObject and CompleteMultipartUpload), x-amz-checksum-crc32c on every body with the
// server refusing a wrong one, and the engine's commit refusing a second save that
// committed first.
#include <gtest/gtest.h>

#include "core/buffer_pool.h"
#include "core/checksum.h"
#include "engine/save_steps.h"
#include "s3_servers.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/http/body_checksum.h"
#include "storage/http/http_client.h"
#include "storage/s3/s3_storage.h"
#include "storage_test_util.h"
#include "test_util.h"

namespace shardpoint::storage::testing {
namespace {

using shardpoint::testing::unique_name;

std::string sha256_hex(ByteSpan data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

// A signed request to the server with the given extra headers; with unsigned_payload its
// x-amz-content-sha256 is UNSIGNED-PAYLOAD instead of the body's hash.
http::Response signed_request(const S3TestServer& moto, const std::string& method, const std::string& path,
                              const std::string& body, std::vector<std::string> headers,
                              bool unsigned_payload = false) {
  http::HttpClient client;
  http::Request r;
  r.method = method;
  r.url = moto.endpoint() + path;
  r.body = as_bytes(body);
  r.headers = std::move(headers);
  r.headers.push_back("x-amz-content-sha256: " +
                      (unsigned_payload ? std::string("UNSIGNED-PAYLOAD") : sha256_hex(as_bytes(body))));
  r.aws_sigv4 = "aws:amz:us-east-1:s3";
  r.userpwd = moto.access_key() + ":" + moto.secret_key();
  return client.execute(r, {}, method + " " + path);
}

std::unique_ptr<Storage> s3_storage(const std::string& prefix,
                                    s3::S3Config::PayloadSigning signing = s3::S3Config::PayloadSigning::kAuto) {
  s3::S3Config config = s3::s3_config(Location::parse("s3://sp-test/" + prefix));
  config.part_bytes = std::size_t{5} << 20;
  config.payload_signing = signing;
  return s3::make_s3_storage(config);
}

class S3CommitTest : public ::testing::TestWithParam<std::string> {};
class S3ChecksumTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Servers, S3CommitTest, s3_server_kinds(), S3ServerKindName());
INSTANTIATE_TEST_SUITE_P(Servers, S3ChecksumTest, s3_server_kinds(), S3ServerKindName());

TEST_P(S3CommitTest, CreateOnlyMultipartCommitIsRefusedWhenAnObjectExists) {
  SP_REQUIRE_S3(moto, GetParam());
  auto st = s3_storage(unique_name("create-only"));
  WriteOptions create_only;
  create_only.if_absent = true;
  const std::string big = pattern((std::size_t{11} << 20) + 7, 1);  // 3 parts of 5 MiB
  auto w = st->open_writer("big", create_only);
  w->append(as_bytes(big));
  w->commit();
  EXPECT_EQ(read_all(*st, "big"), big);

  const std::string other = pattern((std::size_t{11} << 20) + 7, 2);
  auto second = st->open_writer("big", create_only);
  second->append(as_bytes(other));
  try {
    second->commit();
    ADD_FAILURE() << "a second create-only multipart commit succeeded";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kAlreadyExists) << e.what();
    EXPECT_NE(std::string(e.what()).find("S3 object \"s3://sp-test/"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HTTP 412"), std::string::npos) << e.what();
  }
  second.reset();
  EXPECT_EQ(read_all(*st, "big"), big);
  EXPECT_EQ(open_uploads(*moto, "sp-test"), 0);  // the refused upload was aborted

  // write_atomic above one part goes up in parts, create-only too; the same bytes again count
  // as written (a retry that finds its own object), other bytes do not.
  st->write_atomic("atomic-big", as_bytes(big), create_only);
  st->write_atomic("atomic-big", as_bytes(big), create_only);
  EXPECT_THROW(st->write_atomic("atomic-big", as_bytes(other), create_only), StorageError);
  EXPECT_EQ(read_all(*st, "atomic-big"), big);
}

TEST_P(S3ChecksumTest, PutsCarryCrc32cThatTheServerKeepsAndChecks) {
  SP_REQUIRE_S3(moto, GetParam());
  const std::string prefix = unique_name("crc");
  auto st = s3_storage(prefix);
  const std::string small = pattern(100000, 3);
  st->write_atomic("small", as_bytes(small));
  // S3 keeps the checksum it was sent (and checked) with the object.
  http::Response head =
      signed_request(*moto, "HEAD", "/sp-test/" + prefix + "/small", "", {"x-amz-checksum-mode: ENABLED"});
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("x-amz-checksum-crc32c"), http::crc32c_base64(crc32c(0, as_bytes(small))));

  // A multipart upload created with the CRC32C algorithm, parts with their checksums.
  const std::string big = pattern((std::size_t{11} << 20) + 7, 4);
  st->write_atomic("big", as_bytes(big));
  EXPECT_EQ(read_all(*st, "big"), big);
  head = signed_request(*moto, "HEAD", "/sp-test/" + prefix + "/big", "", {"x-amz-checksum-mode: ENABLED"});
  // S3 answers the CRC-32C of the parts' CRCs and "-3"; moto 5.2.1 computes its own value
  // (CRC-32 without the crc32c module) and no suffix: only that the upload kept one is moto's.
  // s3s-fs 0.14.1 keeps no checksum for a completed multipart upload.
  const bool s3s_fs = GetParam() == "s3s_fs";
  if (!s3s_fs) {
    EXPECT_FALSE(head.header("x-amz-checksum-crc32c").empty());
  }

  // The server refuses a body whose x-amz-checksum-crc32c does not match it (its SHA-256
  // does: only the CRC is wrong), and stores nothing.
  const std::string body = "a body whose crc32c header is wrong";
  http::Response refused = signed_request(
      *moto, "PUT", "/sp-test/" + prefix + "/wrong", body,
      {"x-amz-checksum-crc32c: " + http::crc32c_base64(0x12345678u), "x-amz-sdk-checksum-algorithm: CRC32C"});
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(http::xml_value(refused.body, "Code"), "BadDigest") << refused.body;
  EXPECT_TRUE(http::s3_body_mismatch(refused));  // the driver retries it: the resend is the fix
  // s3s-fs 0.14.1 answers BadDigest but has already stored the body (its file is written
  // before the check): a server bug, seen here; S3 and moto store nothing.
  if (!s3s_fs) {
    EXPECT_FALSE(st->try_stat("wrong").has_value());
  }
  http::Response accepted = signed_request(*moto, "PUT", "/sp-test/" + prefix + "/right", body,
                                           {"x-amz-checksum-crc32c: " + http::crc32c_base64(crc32c(0, as_bytes(body))),
                                            "x-amz-sdk-checksum-algorithm: CRC32C"});
  EXPECT_EQ(accepted.status, 200) << accepted.body;
}

// UNSIGNED-PAYLOAD bodies (S3Config::payload_signing, forced here over the servers' plain
// http): the server takes them with their x-amz-checksum-crc32c and refuses one whose CRC
// does not match (the check that replaces the signed hash); the driver's PutObject and
// multipart upload go through intact.
TEST_P(S3ChecksumTest, UnsignedPayloadBodiesAreCheckedByTheirCrc32c) {
  SP_REQUIRE_S3(moto, GetParam());
  const std::string prefix = unique_name("unsigned");
  const std::string body = "an unsigned body";
  const std::string path = "/sp-test/" + prefix + "/raw";
  http::Response refused = signed_request(
      *moto, "PUT", path, body,
      {"x-amz-checksum-crc32c: " + http::crc32c_base64(0x12345678u), "x-amz-sdk-checksum-algorithm: CRC32C"},
      /*unsigned_payload=*/true);
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(http::xml_value(refused.body, "Code"), "BadDigest") << refused.body;
  http::Response accepted = signed_request(*moto, "PUT", path, body,
                                           {"x-amz-checksum-crc32c: " + http::crc32c_base64(crc32c(0, as_bytes(body))),
                                            "x-amz-sdk-checksum-algorithm: CRC32C"},
                                           /*unsigned_payload=*/true);
  EXPECT_EQ(accepted.status, 200) << accepted.body;

  auto st = s3_storage(prefix, s3::S3Config::PayloadSigning::kUnsigned);
  const std::string small = pattern(100000, 5);
  st->write_atomic("small", as_bytes(small));
  EXPECT_EQ(read_all(*st, "small"), small);
  const std::string big = pattern((std::size_t{11} << 20) + 7, 6);  // 3 parts of 5 MiB
  st->write_atomic("big", as_bytes(big));
  EXPECT_EQ(read_all(*st, "big"), big);
}

TEST_P(S3CommitTest, ASaveWhoseMetadataAnotherSaveCommittedFirstFailsAndLeavesTheOther) {
  SP_REQUIRE_S3(moto, GetParam());
  auto st = open_storage("s3://sp-test/" + unique_name("race"));
  // The other save's commit: its sidecar and `.metadata` are in place.
  st->write_atomic(engine::kChecksumSidecar, as_bytes(std::string_view("the other save's sidecar")));
  st->write_atomic(engine::kMetadataKey, as_bytes(std::string_view("the other save's metadata")));
  try {
    engine::save_steps::publish_checkpoint(*st, "this save's metadata", nullptr, {}, engine::SaveOptions{});
    ADD_FAILURE() << "the second commit succeeded";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kAlreadyExists) << e.what();
    EXPECT_NE(std::string(e.what()).find("another save committed into this folder"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(".metadata"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_all(*st, engine::kMetadataKey), "the other save's metadata");
  // The sidecar is this save's (written before its `.metadata`), and left with the winner's.
  EXPECT_TRUE(st->try_stat(engine::kChecksumSidecar).has_value());
}

}  // namespace
}  // namespace shardpoint::storage::testing
