#include "storage/http/body_checksum.h"

#include <nlohmann/json.hpp>

#include "core/base64.h"
#include "core/checksum.h"

namespace shardpoint::storage::http {

std::string content_md5(ByteSpan body) { return content_md5(md5_digest(body)); }

std::string content_md5(std::span<const ByteSpan> pieces) {
  Md5 md5;
  for (ByteSpan piece : pieces) md5.update(piece);
  return content_md5(md5.digest());
}

std::string content_md5(const std::array<std::uint8_t, 16>& md5) {
  return base64_encode(std::string_view(reinterpret_cast<const char*>(md5.data()), md5.size()));
}

std::string crc32c_base64(std::uint32_t crc) {
  const std::array<char, 4> big_endian = {static_cast<char>(crc >> 24), static_cast<char>(crc >> 16),
                                          static_cast<char>(crc >> 8), static_cast<char>(crc)};
  return base64_encode(std::string_view(big_endian.data(), big_endian.size()));
}

std::string goog_hash_crc32c(std::uint32_t crc) { return "crc32c=" + crc32c_base64(crc); }

bool s3_body_mismatch(const Response& response) {
  if (response.status != 400) return false;
  const std::string code = xml_value(response.body, "Code");
  return code == "BadDigest" || code == "XAmzContentSHA256Mismatch";
}

bool azure_body_mismatch(const Response& response) {
  if (response.status != 400) return false;
  std::string code = response.header("x-ms-error-code");
  if (code.empty()) code = xml_value(response.body, "Code");
  if (code == "Md5Mismatch" || code == "Crc64Mismatch") return true;
  // Azurite's answer to a Put Block or Put Blob whose Content-MD5 does not match.
  return code == "InvalidOperation" &&
         xml_value(response.body, "Message").find("contentMD5 doesn't match") != std::string::npos;
}

bool gcs_json_body_mismatch(const Response& response) {
  if (response.status != 400) return false;
  const auto body = nlohmann::json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object() || !body.contains("error") || !body["error"].is_object()) return false;
  const auto message = body["error"].find("message");
  if (message == body["error"].end() || !message->is_string()) return false;
  const std::string text = message->get<std::string>();
  // "Provided CRC32C \"...\" doesn't match calculated CRC32C \"...\"." (MD5 alike).
  return (text.find("CRC32C") != std::string::npos || text.find("MD5") != std::string::npos) &&
         text.find("doesn't match calculated") != std::string::npos;
}

}  // namespace shardpoint::storage::http
