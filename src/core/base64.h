// Base64 (RFC 4648: the standard alphabet, '=' padding), the form HTTP headers give binary
// values: Content-MD5, X-Goog-Hash, Azure account keys and SharedKey signatures.
// Pure functions, thread-safe. Backed by OpenSSL.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace shardpoint {

// The padded encoding of bytes ("" for none).
std::string base64_encode(std::string_view bytes);

// The bytes text encodes; nullopt when text is not padded base64 (a length that is not a
// multiple of 4, a character outside the alphabet, '=' other than at the end).
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace shardpoint
