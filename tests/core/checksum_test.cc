#include "core/checksum.h"

#include <gtest/gtest.h>

namespace shardpoint {
namespace {

// Reference values: the standard check value of each algorithm over "123456789".
TEST(Checksum, KnownCheckValues) {
  auto data = as_bytes("123456789");
  EXPECT_EQ(crc32(0, data), 0xCBF43926u);
  EXPECT_EQ(crc32c(0, data), 0xE3069283u);
  Sha256 sha;
  sha.update(as_bytes("abc"));
  EXPECT_EQ(sha.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // RFC 1321's test suite.
  EXPECT_EQ(md5_hex(as_bytes("")), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex(as_bytes("abc")), "900150983cd24fb0d6963f7d28e17f72");
  const std::array<std::uint8_t, 16> abc = md5_digest(as_bytes("abc"));
  EXPECT_EQ(abc.front(), 0x90u);
  EXPECT_EQ(abc.back(), 0x72u);
}

TEST(Checksum, IncrementalEqualsOneShot) {
  std::string s(10000, 'x');
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 7);
  auto all = as_bytes(s);
  EXPECT_EQ(crc32(crc32(0, all.first(3333)), all.subspan(3333)), crc32(0, all));
  EXPECT_EQ(crc32c(crc32c(0, all.first(17)), all.subspan(17)), crc32c(0, all));
  Xxh3 h;
  h.update(all.first(5000));
  h.update(all.subspan(5000));
  EXPECT_EQ(h.digest(), xxh3_64(all));
  h.reset();  // starts over: the digest is that of what follows only
  h.update(all.subspan(5000));
  EXPECT_EQ(h.digest(), xxh3_64(all.subspan(5000)));
  EXPECT_EQ(crc32(0, {}), 0u);
  Md5 md5;
  md5.update(all.first(4321));
  md5.update(all.subspan(4321));
  EXPECT_EQ(md5.digest(), md5_digest(all));
}

// Pieces checksummed apart (by different ranks) combine into the checksum of the whole.
TEST(Checksum, Crc32cCombineEqualsWhole) {
  std::string s(300000, 'x');
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 2654435761u) >> 13);
  auto all = as_bytes(s);
  for (std::size_t split : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{4096}, std::size_t{131071},
                            s.size() - 1, s.size()}) {
    const std::uint32_t a = crc32c(0, all.first(split));
    const std::uint32_t b = crc32c(0, all.subspan(split));
    EXPECT_EQ(crc32c_combine(a, b, s.size() - split), crc32c(0, all)) << "split " << split;
  }
  // Three pieces, combined left to right.
  const std::uint32_t ab = crc32c_combine(crc32c(0, all.first(1000)), crc32c(0, all.subspan(1000, 5000)), 5000);
  EXPECT_EQ(crc32c_combine(ab, crc32c(0, all.subspan(6000)), s.size() - 6000), crc32c(0, all));
}

// The zip CRC-32 of a record read in slabs: the pieces' CRCs combine into the record's.
TEST(Checksum, Crc32CombineEqualsWhole) {
  std::string s(300000, 'x');
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 2654435761u) >> 11);
  auto all = as_bytes(s);
  // "123456789" is the CRC-32 check string: 0xcbf43926.
  EXPECT_EQ(crc32_combine(crc32(0, as_bytes(std::string("1234"))), crc32(0, as_bytes(std::string("56789"))), 5),
            0xcbf43926u);
  for (std::size_t split : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, s.size() - 1, s.size()}) {
    const std::uint32_t a = crc32(0, all.first(split));
    const std::uint32_t b = crc32(0, all.subspan(split));
    EXPECT_EQ(crc32_combine(a, b, s.size() - split), crc32(0, all)) << "split " << split;
  }
}

}  // namespace
}  // namespace shardpoint
