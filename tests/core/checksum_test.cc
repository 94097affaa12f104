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
  EXPECT_EQ(crc32(0, {}), 0u);
}

}  // namespace
}  // namespace shardpoint
