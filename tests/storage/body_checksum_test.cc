// The body checksums object-store requests carry (exact header values) and how each
// service's refusal of a damaged body is told from its other 400s.
#include "storage/http/body_checksum.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/checksum.h"

namespace shardpoint::storage::http {
namespace {

Response answer(long status, std::string body, std::map<std::string, std::string> headers = {}) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

std::string s3_error(const std::string& code) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>" + code +
         "</Code><Message>m</Message><RequestId>r</RequestId></Error>";
}

std::string gcs_error(const std::string& message) {
  return R"({"error": {"code": 400, "message": ")" + message + R"(", "errors": [{"reason": "invalid"}]}})";
}

TEST(BodyChecksumTest, ContentMd5IsBase64OfTheBinaryDigest) {
  // RFC 1321's MD5 of "" and "abc" (d41d8cd9..., 90015098...), base64 as RFC 1864 wants.
  EXPECT_EQ(content_md5(as_bytes("")), "1B2M2Y8AsgTpgAmY7PhCfg==");
  EXPECT_EQ(content_md5(as_bytes("abc")), "kAFQmDzST7DWlj99KOF/cg==");
  // Of pieces sent one after another, and of a digest computed as they were appended.
  const std::vector<ByteSpan> pieces = {as_bytes("a"), ByteSpan(), as_bytes("bc")};
  EXPECT_EQ(content_md5(pieces), "kAFQmDzST7DWlj99KOF/cg==");
  EXPECT_EQ(content_md5(md5_digest(as_bytes("abc"))), "kAFQmDzST7DWlj99KOF/cg==");
}

TEST(BodyChecksumTest, GoogHashCarriesTheCrcBigEndian) {
  // The CRC-32C check value 0xE3069283: bytes e3 06 92 83, most significant first.
  EXPECT_EQ(goog_hash_crc32c(crc32c(0, as_bytes("123456789"))), "crc32c=4waSgw==");
  EXPECT_EQ(goog_hash_crc32c(0), "crc32c=AAAAAA==");  // the empty object
  EXPECT_EQ(goog_hash_crc32c(0x01020304u), "crc32c=AQIDBA==");
}

TEST(BodyChecksumTest, S3ChecksumCrc32cIsTheSameBase64) {
  // x-amz-checksum-crc32c: base64 of the big-endian CRC-32C, as GCS's crc32c= value.
  EXPECT_EQ(crc32c_base64(crc32c(0, as_bytes("123456789"))), "4waSgw==");
  EXPECT_EQ(crc32c_base64(0), "AAAAAA==");
  EXPECT_EQ("crc32c=" + crc32c_base64(0x01020304u), goog_hash_crc32c(0x01020304u));
}

TEST(BodyChecksumTest, S3RefusalsOfADamagedBody) {
  EXPECT_TRUE(s3_body_mismatch(answer(400, s3_error("BadDigest"))));
  EXPECT_TRUE(s3_body_mismatch(answer(400, s3_error("XAmzContentSHA256Mismatch"))));
  // A Content-MD5 that is not an MD5 is the sender's mistake: resending cannot fix it.
  EXPECT_FALSE(s3_body_mismatch(answer(400, s3_error("InvalidDigest"))));
  EXPECT_FALSE(s3_body_mismatch(answer(400, s3_error("MalformedXML"))));
  EXPECT_FALSE(s3_body_mismatch(answer(403, s3_error("BadDigest"))));
  EXPECT_FALSE(s3_body_mismatch(answer(400, "")));
}

TEST(BodyChecksumTest, AzureRefusalsOfADamagedBody) {
  EXPECT_TRUE(azure_body_mismatch(answer(400, "", {{"x-ms-error-code", "Md5Mismatch"}})));
  EXPECT_TRUE(azure_body_mismatch(answer(400, "", {{"x-ms-error-code", "Crc64Mismatch"}})));
  EXPECT_TRUE(azure_body_mismatch(answer(400, s3_error("Md5Mismatch"))));  // the code only in the body
  // Azurite's answer.
  const std::string azurite =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InvalidOperation</Code><Message>Provided contentMD5 "
      "doesn't match.\nRequestId:1\nTime:2026-01-01T00:00:00.000Z</Message></Error>";
  EXPECT_TRUE(azure_body_mismatch(answer(400, azurite, {{"x-ms-error-code", "InvalidOperation"}})));
  EXPECT_FALSE(
      azure_body_mismatch(answer(400, s3_error("InvalidOperation"), {{"x-ms-error-code", "InvalidOperation"}})));
  EXPECT_FALSE(azure_body_mismatch(answer(400, "", {{"x-ms-error-code", "InvalidHeaderValue"}})));
  EXPECT_FALSE(azure_body_mismatch(answer(403, "", {{"x-ms-error-code", "Md5Mismatch"}})));
}

TEST(BodyChecksumTest, GcsJsonRefusalsOfADamagedBody) {
  EXPECT_TRUE(gcs_json_body_mismatch(
      answer(400, gcs_error(R"(Provided CRC32C \"AAAAAA==\" doesn't match calculated CRC32C \"4waSgw==\".)"))));
  EXPECT_TRUE(gcs_json_body_mismatch(answer(
      400, gcs_error(R"(Provided MD5 hash \"a\" doesn't match calculated MD5 hash \"1B2M2Y8AsgTpgAmY7PhCfg==\".)"))));
  EXPECT_FALSE(gcs_json_body_mismatch(answer(400, gcs_error("Invalid argument."))));
  EXPECT_FALSE(gcs_json_body_mismatch(answer(400, "Provided CRC32C doesn't match calculated CRC32C")));  // not JSON
  EXPECT_FALSE(gcs_json_body_mismatch(answer(400, R"({"error": "x"})")));
  EXPECT_FALSE(gcs_json_body_mismatch(
      answer(412, gcs_error(R"(Provided CRC32C \"A\" doesn't match calculated CRC32C \"B\".)"))));
}

}  // namespace
}  // namespace shardpoint::storage::http
