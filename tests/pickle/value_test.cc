#include "shardpoint/pickle_value.h"

#include <gtest/gtest.h>

#include "shardpoint/error.h"

namespace shardpoint::pickle {
namespace {

TEST(Value, BigIntegersNormalize) {
  EXPECT_EQ(Value::big_integer(std::string("\xff", 1))->as_int(), -1);
  EXPECT_EQ(Value::big_integer(std::string("\x00\x01", 2))->as_int(), 256);
  EXPECT_EQ(Value::big_integer("")->as_int(), 0);
  auto big = Value::big_integer(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x01", 9));  // 2**64
  EXPECT_FALSE(big->int_fits_int64());
  EXPECT_THROW(big->as_int(), FormatError);
  EXPECT_EQ(Value::integer(-129)->int_le_bytes(), std::string("\x7f\xff", 2));
  EXPECT_EQ(Value::integer(255)->int_le_bytes(), std::string("\xff\x00", 2));
}

TEST(Value, AccessorsCheckKind) {
  auto d = Value::dict({{Value::str("a"), Value::integer(1)}});
  EXPECT_EQ(d->get("a")->as_int(), 1);
  EXPECT_EQ(d->get("b"), nullptr);
  EXPECT_THROW(d->as_int(), FormatError);
  auto g = Value::global("torch", "float32");
  EXPECT_TRUE(g->is_global("torch", "float32"));
  EXPECT_FALSE(g->is_global("torch", "float16"));
}

TEST(Value, DeepNestingDestroysWithoutRecursion) {
  ValuePtr v = Value::list();
  for (int i = 0; i < 1000000; ++i) v = Value::list({v});
  v.reset();  // would overflow the stack with recursive destruction
  SUCCEED();
}

TEST(Value, DeepEqualFollowsStructure) {
  auto a = Value::call("collections", "OrderedDict", {});
  a->mutable_entries().push_back({Value::str("x"), Value::floating(1.5)});
  auto b = Value::call("collections", "OrderedDict", {});
  b->mutable_entries().push_back({Value::str("x"), Value::floating(1.5)});
  EXPECT_TRUE(deep_equal(*a, *b));
  b->mutable_entries()[0].second = Value::floating(2.5);
  EXPECT_FALSE(deep_equal(*a, *b));
  auto l1 = Value::list();
  l1->mutable_items().push_back(l1);
  auto l2 = Value::list();
  l2->mutable_items().push_back(l2);
  EXPECT_TRUE(deep_equal(*l1, *l2));
  l1->mutable_items().clear();  // break the cycle so the test does not leak
  l2->mutable_items().clear();
}

}  // namespace
}  // namespace shardpoint::pickle
