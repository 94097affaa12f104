#include "core/base64.h"

#include <gtest/gtest.h>

#include <string>

namespace shardpoint {
namespace {

// RFC 4648 section 10's test vectors, both ways.
TEST(Base64Test, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},
      {"f", "Zg=="},
      {"fo", "Zm8="},
      {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="},
      {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"},
  };
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded) << plain;
    EXPECT_EQ(base64_decode(encoded), std::optional<std::string>(plain)) << encoded;
  }
}

TEST(Base64Test, EveryByteValueRoundTrips) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (std::size_t n = 0; n <= all.size(); n += 37) {
    const std::string bytes = all.substr(0, n);
    EXPECT_EQ(base64_decode(base64_encode(bytes)), std::optional<std::string>(bytes)) << n;
  }
  EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");  // '+' and '/' of the standard alphabet
}

TEST(Base64Test, RejectsWhatIsNotPaddedBase64) {
  EXPECT_EQ(base64_decode("Zg"), std::nullopt);        // unpadded
  EXPECT_EQ(base64_decode("Zm9"), std::nullopt);       // length not a multiple of 4
  EXPECT_EQ(base64_decode("Zg==Zg=="), std::nullopt);  // padding inside
  EXPECT_EQ(base64_decode("Z*9v"), std::nullopt);      // outside the alphabet
  EXPECT_EQ(base64_decode("Zm-_"), std::nullopt);      // the URL-safe alphabet is another encoding
}

}  // namespace
}  // namespace shardpoint
