// Checksums and digests used across shardpoint.
//
//   crc32   - the zip CRC-32 (IEEE, reflected), as zip records and torch.save carry it.
//   crc32c  - Castagnoli; per-item checksums of the shardpoint sidecar.
//   xxh3_64 - XXH3 64-bit; the faster per-item checksum option.
//   Sha256  - the content hash of `inspect --hash`.
//   MD5     - what object stores take and give for a body (Content-MD5, S3 ETags).
// Incremental forms take the previous value so bytes can be hashed as they stream out.
// All functions are pure and thread-safe. Backed by ISA-L (crc), libxxhash and OpenSSL.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "core/byte_io.h"

namespace shardpoint {

// crc32(prev, data): continue a CRC-32 whose value so far is prev (0 to start).
std::uint32_t crc32(std::uint32_t prev, ByteSpan data);

// crc32c(prev, data): continue a CRC-32C whose value so far is prev (0 to start).
std::uint32_t crc32c(std::uint32_t prev, ByteSpan data);

// crc32c_combine(crc32c(0, A), crc32c(0, B), B.size()) == crc32c(0, A || B): the CRC of two
// pieces read by different ranks, joined without the bytes (CRC is linear over GF(2); this
// multiplies the first CRC by x^(8 * len_b) modulo the polynomial). O(log len_b).
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b);

// crc32_combine: the same for the zip CRC-32 (crc32 above): pieces of one zip record read
// at different times (slabs of a consolidate, items of a load) checked as the whole record.
std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b);

// Streaming XXH3-64 (seed 0).
class Xxh3 {
 public:
  Xxh3();
  ~Xxh3();
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;
  void update(ByteSpan data);
  std::uint64_t digest() const;
  // Starts over (as if just constructed), keeping the state's memory.
  void reset();

 private:
  void* state_;
};

std::uint64_t xxh3_64(ByteSpan data);

// Streaming SHA-256.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(ByteSpan data);
  // Lowercase hex of the digest. Finalizes: call once.
  std::string hex_digest();

 private:
  void* ctx_;
};

// Streaming MD5, for a Content-MD5 over a body appended in slices (http/upload_writer.h).
class Md5 {
 public:
  Md5();
  ~Md5();
  Md5(const Md5&) = delete;
  Md5& operator=(const Md5&) = delete;
  void update(ByteSpan data);
  // The 16-byte digest. Finalizes: call once.
  std::array<std::uint8_t, 16> digest();

 private:
  void* ctx_;
};

// The MD5 of data, 16 bytes (Content-MD5 headers: a server checks a request body with it).
std::array<std::uint8_t, 16> md5_digest(ByteSpan data);

// Lowercase hex of the MD5 of data (S3's ETags; not for integrity of our own files).
std::string md5_hex(ByteSpan data);

}  // namespace shardpoint
