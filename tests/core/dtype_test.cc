#include "shardpoint/dtype.h"

#include <gtest/gtest.h>

namespace shardpoint {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType d : kAllDTypes) {
    auto parsed = dtype_from_name(dtype_name(d));
    ASSERT_TRUE(parsed.has_value()) << dtype_name(d);
    EXPECT_EQ(*parsed, d);
  }
}

TEST(DType, AliasesAndSizes) {
  EXPECT_EQ(dtype_from_name("float"), DType::kFloat32);
  EXPECT_EQ(dtype_from_name("long"), DType::kInt64);
  EXPECT_EQ(dtype_from_name("half"), DType::kFloat16);
  EXPECT_FALSE(dtype_from_name("float33").has_value());
  EXPECT_EQ(dtype_itemsize(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_itemsize(DType::kComplex128), 16u);
  EXPECT_EQ(dtype_itemsize(DType::kBool), 1u);
  EXPECT_EQ(dtype_name(DType::kFloat8_e4m3fn), "float8_e4m3fn");
}

}  // namespace
}  // namespace shardpoint
