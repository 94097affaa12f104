#include "core/byte_io.h"

#include <gtest/gtest.h>

namespace shardpoint {
namespace {

TEST(ByteIo, LittleEndianByteOrder) {
  std::string out;
  put_le<std::uint32_t>(out, 0x04030201u);
  put_le<std::uint16_t>(out, 0xBEEF);
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(out[0], '\x01');
  EXPECT_EQ(out[3], '\x04');
  EXPECT_EQ(static_cast<unsigned char>(out[4]), 0xEF);
  EXPECT_EQ(get_le<std::uint32_t>(as_bytes(out).data()), 0x04030201u);
  EXPECT_EQ(get_le<std::int16_t>(as_bytes(out).data() + 4), static_cast<std::int16_t>(0xBEEF));
}

TEST(ByteIo, CursorRejectsEveryTruncation) {
  std::string data;
  put_le<std::uint64_t>(data, 42);
  for (std::size_t len = 0; len < data.size(); ++len) {
    ByteCursor c(as_bytes(data).first(len), 100);
    try {
      c.read_le<std::uint64_t>("header field");
      FAIL() << "read past the end at length " << len;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("header field at offset 100"), std::string::npos) << e.what();
    }
  }
  ByteCursor full(as_bytes(data));
  EXPECT_EQ(full.read_le<std::uint64_t>("x"), 42u);
  EXPECT_TRUE(full.at_end());
  EXPECT_THROW(full.read_bytes(1, "y"), FormatError);
}

}  // namespace
}  // namespace shardpoint
