// Checksums of request bodies, so that an object store refuses a body damaged on its way
// instead of storing it: the header values each service takes, and how each one says that
// a body did not match them. HttpClient retries such an answer (the resend is the fix) when
// the Request's body_mismatch, set to the service's function below, says so.
//
//   service     the driver sends                           a damaged body gets
//   S3          x-amz-content-sha256 (hex SHA-256, signed)  400 XAmzContentSHA256Mismatch
//   S3 API      Content-MD5 when S3Config::content_md5      400 BadDigest
//               x-amz-checksum-crc32c when                  400 BadDigest
//               S3Config::checksum_crc32c
//   Azure Blob  Content-MD5 on every request with a body    400 Md5Mismatch (Azurite: 400
//                                                           InvalidOperation, "Provided
//                                                           contentMD5 doesn't match.")
//   GCS JSON    X-Goog-Hash: crc32c=... of the whole        400 "Provided CRC32C ... doesn't
//               object, on the request that creates it      match calculated CRC32C ..."
//
// Pure functions, thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "core/byte_io.h"
#include "storage/http/http_client.h"

namespace shardpoint::storage::http {

// The Content-MD5 value of body: base64 of its 16-byte MD5 (RFC 1864).
std::string content_md5(ByteSpan body);

// The Content-MD5 value of a body of pieces sent one after another (Request::body_pieces).
std::string content_md5(std::span<const ByteSpan> pieces);

// The Content-MD5 value of a body whose MD5 is md5 (computed as it was appended).
std::string content_md5(const std::array<std::uint8_t, 16>& md5);

// Base64 of a CRC-32C's 4 bytes, most significant first: the encoding of GCS's X-Goog-Hash
// and S3's x-amz-checksum-crc32c.
std::string crc32c_base64(std::uint32_t crc);

// The X-Goog-Hash value of an object whose CRC-32C is crc: "crc32c=" + crc32c_base64(crc).
std::string goog_hash_crc32c(std::uint32_t crc);

// True when an answer says the server computed another checksum of the body than the
// request carried. Other 400s (a bad Content-MD5 value, InvalidDigest; a malformed request)
// are false: sending the same request again cannot fix them.
bool s3_body_mismatch(const Response& response);
bool azure_body_mismatch(const Response& response);
bool gcs_json_body_mismatch(const Response& response);

}  // namespace shardpoint::storage::http
