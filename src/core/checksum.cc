#include "core/checksum.h"

#include <isa-l/crc.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include <array>
#include <limits>

namespace shardpoint {
namespace {

// ISA-L takes a 64-bit length on crc32_gzip_refl and crc32_iscsi takes int; feed in
// pieces so huge spans are safe.
constexpr std::size_t kMaxPiece = std::size_t{1} << 30;

const unsigned char* uchars(ByteSpan s) { return reinterpret_cast<const unsigned char*>(s.data()); }

}  // namespace

std::uint32_t crc32(std::uint32_t prev, ByteSpan data) {
  std::uint32_t crc = prev;
  while (!data.empty()) {
    std::size_t n = std::min(data.size(), kMaxPiece);
    crc = crc32_gzip_refl(crc, const_cast<unsigned char*>(uchars(data)), n);
    data = data.subspan(n);
  }
  return crc;
}

std::uint32_t crc32c(std::uint32_t prev, ByteSpan data) {
  // crc32_iscsi works on the raw (non-inverted) register; invert on the way in and out so
  // the result is the standard CRC-32C value and chaining works like crc32().
  std::uint32_t crc = ~prev;
  while (!data.empty()) {
    std::size_t n = std::min(data.size(), kMaxPiece);
    crc = crc32_iscsi(const_cast<unsigned char*>(uchars(data)), static_cast<int>(n), crc);
    data = data.subspan(n);
  }
  return ~crc;
}

namespace {

// Polynomials over GF(2) modulo a CRC polynomial, in the reflected bit order the CRC
// register uses: bit 31 is x^0, bit 0 is x^31.
constexpr std::uint32_t kCrc32cReflected = 0x82f63b78u;
constexpr std::uint32_t kCrc32Reflected = 0xedb88320u;  // the zip CRC-32's

template <std::uint32_t kPoly>
std::uint32_t multiply_mod_p(std::uint32_t a, std::uint32_t b) {
  std::uint32_t product = 0;
  for (std::uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;  // b *= x
  }
  return product;
}

// x^(8 * bytes) modulo p, by squaring: powers[k] = x^(2^k).
template <std::uint32_t kPoly>
std::uint32_t x_to_8n_mod_p(std::uint64_t bytes) {
  static const auto powers = [] {
    std::array<std::uint32_t, 64> p{};
    p[0] = 1u << 30;  // x^1
    for (std::size_t k = 1; k < p.size(); ++k) p[k] = multiply_mod_p<kPoly>(p[k - 1], p[k - 1]);
    return p;
  }();
  std::uint32_t result = 1u << 31;  // x^0
  std::size_t k = 3;                // 8 * bytes = bytes * 2^3
  for (; bytes != 0 && k < powers.size(); bytes >>= 1, ++k) {
    if (bytes & 1) result = multiply_mod_p<kPoly>(powers[k], result);
  }
  return result;
}

}  // namespace

// The pre/post inversions of crc_a and crc_b cancel: only crc_a is shifted by len_b bytes.
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) {
  return multiply_mod_p<kCrc32cReflected>(x_to_8n_mod_p<kCrc32cReflected>(len_b), crc_a) ^ crc_b;
}

std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) {
  return multiply_mod_p<kCrc32Reflected>(x_to_8n_mod_p<kCrc32Reflected>(len_b), crc_a) ^ crc_b;
}

Xxh3::Xxh3() : state_(XXH3_createState()) { reset(); }
Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3::update(ByteSpan data) { XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data.data(), data.size()); }
std::uint64_t Xxh3::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }
void Xxh3::reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }

std::uint64_t xxh3_64(ByteSpan data) { return XXH3_64bits(data.data(), data.size()); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr); }
Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Sha256::update(ByteSpan data) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data.data(), data.size()); }
namespace {

std::string lower_hex(const unsigned char* md, unsigned int len) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

}  // namespace

std::string Sha256::hex_digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &len);
  return lower_hex(md, len);
}

Md5::Md5() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_md5(), nullptr); }
Md5::~Md5() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Md5::update(ByteSpan data) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data.data(), data.size()); }
std::array<std::uint8_t, 16> Md5::digest() {
  std::array<std::uint8_t, 16> md{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md.data(), &len);
  return md;
}

std::array<std::uint8_t, 16> md5_digest(ByteSpan data) {
  std::array<std::uint8_t, 16> md{};
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md.data(), &len, EVP_md5(), nullptr);
  return md;
}

std::string md5_hex(ByteSpan data) {
  const std::array<std::uint8_t, 16> md = md5_digest(data);
  return lower_hex(md.data(), static_cast<unsigned int>(md.size()));
}

}  // namespace shardpoint
