#include "pickle/repr.h"

#include <gtest/gtest.h>

#include <cmath>

#include "pickle_test_util.h"

namespace shardpoint::pickle {
namespace {

using testing::bytes_of;
using testing::read;

std::string r(const ValuePtr& v) { return repr(*v); }

// Expected strings are CPython 3.11's repr() of the same value.
TEST(Repr, Scalars) {
  EXPECT_EQ(r(Value::none()), "None");
  EXPECT_EQ(r(Value::boolean(true)), "True");
  EXPECT_EQ(r(Value::boolean(false)), "False");
  EXPECT_EQ(r(Value::integer(-42)), "-42");
  EXPECT_EQ(r(Value::integer(INT64_MIN)), "-9223372036854775808");
  EXPECT_EQ(r(Value::big_integer(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x01", 9))), "18446744073709551616");
  EXPECT_EQ(r(Value::big_integer(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\xff", 9))), "-18446744073709551616");
}

TEST(Repr, FloatsAsPythonPrintsThem) {
  const std::pair<double, const char*> cases[] = {
      {1.5, "1.5"},
      {1e-05, "1e-05"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {123456789012345678.0, "1.2345678901234568e+17"},
      {0.1, "0.1"},
      {1.0 / 3, "0.3333333333333333"},
      {-0.0, "-0.0"},
      {5e-324, "5e-324"},
      {1.7976931348623157e+308, "1.7976931348623157e+308"},
      {100.0, "100.0"},
      {0.0001, "0.0001"},
      {1.0, "1.0"},
      {INFINITY, "inf"},
      {-INFINITY, "-inf"},
      {NAN, "nan"},
  };
  for (const auto& [value, text] : cases) EXPECT_EQ(r(Value::floating(value)), text);
}

TEST(Repr, StrQuotingAndEscapes) {
  EXPECT_EQ(r(Value::str("it's")), "\"it's\"");
  EXPECT_EQ(r(Value::str("a\"b")), "'a\"b'");
  EXPECT_EQ(r(Value::str("both ' and \"")), "'both \\' and \"'");
  EXPECT_EQ(r(Value::str(bytes_of("\x00\t\n\r\x7f\xc2\x80\xc2\xa0\xc2\xad \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                                  "\xe2\x80\x8b\xed\xa0\x80\\"))),
            "'\\x00\\t\\n\\r\\x7f\\x80\\xa0\\xad \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\\u200b\\ud800\\\\'");
}

TEST(Repr, BytesAndByteArray) {
  EXPECT_EQ(r(Value::bytes(bytes_of("\x00\xff'\"\\a"))), "b'\\x00\\xff\\'\"\\\\a'");
  EXPECT_EQ(r(Value::bytes("it's")), "b\"it's\"");
  EXPECT_EQ(r(Value::bytearray("")), "bytearray(b'')");
}

TEST(Repr, Containers) {
  EXPECT_EQ(r(Value::tuple()), "()");
  EXPECT_EQ(r(Value::tuple({Value::integer(1)})), "(1,)");
  EXPECT_EQ(r(Value::tuple({Value::integer(1), Value::integer(2)})), "(1, 2)");
  EXPECT_EQ(r(Value::list({Value::integer(1), Value::integer(2)})), "[1, 2]");
  EXPECT_EQ(r(Value::dict({{Value::integer(1), Value::list({Value::integer(1), Value::str("a")})}})), "{1: [1, 'a']}");
  EXPECT_EQ(r(Value::set()), "set()");
  EXPECT_EQ(r(Value::set({Value::integer(1), Value::integer(2)})), "{1, 2}");
  EXPECT_EQ(r(Value::frozenset()), "frozenset()");
  EXPECT_EQ(r(Value::frozenset({Value::integer(1)})), "frozenset({1})");
}

TEST(Repr, ObjectsAsCalls) {
  EXPECT_EQ(r(Value::global("torch", "float32")), "torch.float32");
  EXPECT_EQ(r(Value::call("pathlib", "PosixPath", {Value::str("/"), Value::str("a"), Value::str("b")})),
            "pathlib.PosixPath('/a/b')");
  EXPECT_EQ(r(Value::call("pathlib", "PosixPath", {Value::str("a"), Value::str("b")})), "pathlib.PosixPath('a/b')");
  auto od = Value::call("collections", "OrderedDict", {});
  od->mutable_entries().push_back({Value::str("a"), Value::integer(1)});
  EXPECT_EQ(r(od), "collections.OrderedDict([('a', 1)])");
  auto ns = Value::object(CallKind::kNewObj, Value::global("argparse", "Namespace"), Value::tuple());
  ns->set_state(Value::dict({{Value::str("lr"), Value::floating(0.1)}}));
  EXPECT_EQ(r(ns), "argparse.Namespace(lr=0.1)");
  EXPECT_EQ(r(Value::call("mymod", "Color", {Value::integer(1)})), "mymod.Color(1)");
  EXPECT_EQ(r(Value::call("builtins", "getattr", {Value::global("mymod", "Color"), Value::str("RED")})),
            "mymod.Color.RED");
  auto props = Value::object(CallKind::kNewObj, Value::global("m", "TensorProperties"), Value::tuple());
  props->set_state(Value::tuple({Value::global("torch", "float32"), Value::boolean(false)}));
  EXPECT_EQ(r(props), "m.TensorProperties(state=(torch.float32, False))");
  auto ex = Value::object(CallKind::kNewObjEx, Value::global("m", "C"), Value::tuple({Value::integer(1)}),
                          Value::dict({{Value::str("k"), Value::none()}}));
  EXPECT_EQ(r(ex), "m.C(1, k=None)");
  EXPECT_EQ(r(Value::persistent_id(Value::tuple({Value::str("storage"), Value::str("0")}))),
            "persistent_id(('storage', '0'))");
}

TEST(Repr, CyclesPrintLikePython) {
  EXPECT_EQ(r(read(bytes_of("\x80\x02]q\x00h\x00"
                            "a."))),
            "[[...]]");
  EXPECT_EQ(r(read(bytes_of("\x80\x02}q\x00X\x01\x00\x00\x00"
                            "ah\x00s."))),
            "{'a': {...}}");
  EXPECT_EQ(r(read(bytes_of("\x80\x02]q\x00h\x00\x85q\x01"
                            "a0h\x01."))),
            "([(...)],)");
}

TEST(Repr, LongOutputIsCut) {
  std::vector<ValuePtr> items(1000, Value::integer(12345));
  std::string text = repr(*Value::list(items), ReprOptions{.max_chars = 20});
  EXPECT_EQ(text, "[12345, 12345, 12345...");
  // An exponentially large DAG prints quickly because printing stops at the limit.
  ValuePtr v = Value::integer(1);
  for (int i = 0; i < 64; ++i) v = Value::list({v, v});
  EXPECT_EQ(repr(*v).size(), 1003u);
  // Cut on a character boundary.
  EXPECT_EQ(repr(*Value::str("\xc3\xa9\xc3\xa9"), ReprOptions{.max_chars = 2}), "'...");
}

// node_text replaces chosen nodes (inspect: tensors inside objects) and skips their children.
TEST(Repr, NodeTextReplacesChosenNodes) {
  ValuePtr tensor = Value::call("torch._utils", "_rebuild_tensor_v2", {Value::integer(0)});
  ValuePtr pair = Value::tuple({tensor, Value::str("l2"), Value::list({tensor})});
  ReprOptions options;
  options.node_text = [&](const Value& v) -> std::optional<std::string> {
    if (&v == tensor.get()) return std::string("tensor(float32, [2])");
    return std::nullopt;
  };
  EXPECT_EQ(repr(*pair, options), "(tensor(float32, [2]), 'l2', [tensor(float32, [2])])");
  EXPECT_EQ(repr(*pair), "(torch._utils._rebuild_tensor_v2(0), 'l2', [torch._utils._rebuild_tensor_v2(0)])");
}

}  // namespace
}  // namespace shardpoint::pickle
