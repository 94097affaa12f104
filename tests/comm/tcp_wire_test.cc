// The TCP communicator's wire format: exact header bytes, round trips, hostile payloads.
#include "comm/tcp_wire.h"

#include <gtest/gtest.h>

#include <limits>

#include "shardpoint/error.h"

namespace shardpoint::comm::tcp_wire {
namespace {

TEST(TcpWireTest, HeaderBytesAreLittleEndian) {
  const Header h{Kind::kBroadcast, 2, 0x0102030405060708ULL, 9};
  const std::string bytes = encode_header(h);
  ASSERT_EQ(bytes.size(), kHeaderBytes);
  EXPECT_EQ(bytes.substr(0, 4), "SPTC");
  EXPECT_EQ(static_cast<unsigned char>(bytes[4]), 3);  // kBroadcast
  EXPECT_EQ(static_cast<unsigned char>(bytes[6]), 2);
  EXPECT_EQ(static_cast<unsigned char>(bytes[8]), 0x08);
  EXPECT_EQ(static_cast<unsigned char>(bytes[15]), 0x01);
  EXPECT_EQ(static_cast<unsigned char>(bytes[16]), 9);
  const std::optional<Header> back = decode_header(reinterpret_cast<const std::byte*>(bytes.data()));
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, h);
  std::string foreign = bytes;
  foreign[0] = 'X';
  EXPECT_FALSE(decode_header(reinterpret_cast<const std::byte*>(foreign.data())));
}

TEST(TcpWireTest, PayloadsRoundTrip) {
  const std::vector<std::string> items = {"", "a", std::string(1000, 'x'), std::string("\0\1", 2)};
  EXPECT_EQ(decode_strings(encode_strings(items)), items);
  EXPECT_EQ(decode_strings(encode_strings({})), std::vector<std::string>{});
  for (std::int64_t v : {std::int64_t{0}, std::int64_t{-1}, std::numeric_limits<std::int64_t>::min()}) {
    EXPECT_EQ(decode_i64(encode_i64(v)), v);
  }
  EXPECT_EQ(decode_double(encode_double(-2.5)), -2.5);
}

TEST(TcpWireTest, TruncatedOrHostilePayloadsAreCommErrors) {
  const std::string full = encode_strings({"abc", "defg"});
  for (std::size_t n = 0; n < full.size(); ++n) {
    EXPECT_THROW(decode_strings(full.substr(0, n)), Error) << n;  // CommError or FormatError
  }
  std::string huge = encode_strings({});
  huge[7] = '\x7f';  // a count that cannot fit in the bytes that follow
  EXPECT_THROW(decode_strings(huge), CommError);
  EXPECT_THROW(decode_i64("1234567"), CommError);
  EXPECT_THROW(decode_double("123456789"), CommError);
}

TEST(TcpWireTest, DescribesCollectives) {
  EXPECT_EQ(describe_collective(Kind::kBroadcast, 2, 7), "broadcast(root 2) (collective #7)");
  EXPECT_EQ(describe_collective(Kind::kBarrier, 0, 1), "barrier (collective #1)");
  EXPECT_STREQ(kind_name(static_cast<Kind>(77)), "unknown");
}

}  // namespace
}  // namespace shardpoint::comm::tcp_wire
