#include "pickle/writer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/byte_io.h"
#include "pickle/reader.h"
#include "pickle_test_util.h"
#include "shardpoint/error.h"

namespace shardpoint::pickle {
namespace {

using testing::bytes_of;
using testing::read;
using testing::write;

ValuePtr ints(std::vector<std::int64_t> values) {
  std::vector<ValuePtr> items;
  for (auto v : values) items.push_back(Value::integer(v));
  return Value::list(std::move(items));
}

ValuePtr strs(std::vector<std::string> values) {
  std::vector<ValuePtr> items;
  for (auto& v : values) items.push_back(Value::str(v));
  return Value::list(std::move(items));
}

ValuePtr big(int bits_shift, bool negative) {
  // +-2**bits_shift as little-endian two's complement.
  std::string le(static_cast<std::size_t>(bits_shift / 8 + 1), '\0');
  le.back() = static_cast<char>(1 << (bits_shift % 8));
  if (negative) {
    unsigned carry = 1;
    for (char& c : le) {
      unsigned v = (~static_cast<unsigned char>(c) & 0xFFu) + carry;
      c = static_cast<char>(v & 0xFF);
      carry = v >> 8;
    }
    le.push_back(static_cast<char>(0xFF));
  } else {
    le.push_back('\0');
  }
  return Value::big_integer(le);
}

// Expected bytes below are CPython 3.11's pickle.dumps(value, protocol).

TEST(Writer, Protocol2IntsExactBytes) {
  auto v = ints({0, 255, 256, 65535, 65536, -1, 2147483647, -2147483648LL, 2147483648LL, -2147483649LL});
  v->mutable_items().push_back(big(63, false));
  v->mutable_items().push_back(big(100, false));
  v->mutable_items().push_back(big(70, true));
  EXPECT_EQ(write(*v, 2),
            bytes_of("\x80\x02]q\x00(K\x00K\xffM\x00\x01M\xff\xffJ\x00\x00\x01\x00J\xff\xff\xff\xffJ\xff\xff\xff\x7fJ"
                     "\x00\x00\x00\x80\x8a\x05\x00\x00\x00\x80\x00\x8a\x05\xff\xff\xff\x7f\xff\x8a\x09\x00\x00\x00\x00"
                     "\x00\x00\x00\x80\x00\x8a\x0d\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x8a\x09\x00\x00"
                     "\x00\x00\x00\x00\x00\x00\xc0"
                     "e."));
}

TEST(Writer, Protocol2StringsExactBytes) {
  EXPECT_EQ(write(*strs({"", "a", "caf\xc3\xa9", "\xf0\x9f\x98\x80"}), 2),
            bytes_of("\x80\x02]q\x00(X\x00\x00\x00\x00q\x01X\x01\x00\x00\x00"
                     "aq\x02X\x05\x00\x00\x00"
                     "caf\xc3\xa9q\x03"
                     "X\x04\x00\x00\x00\xf0\x9f\x98\x80q\x04"
                     "e."));
}

ValuePtr small_dict() {
  return Value::dict({{Value::str("a"), Value::integer(1)},
                      {Value::str("b"), Value::list({Value::boolean(true), Value::none(), Value::floating(1.5)})}});
}

TEST(Writer, Protocol2DictExactBytes) {
  EXPECT_EQ(write(*small_dict(), 2), bytes_of("\x80\x02}q\x00(X\x01\x00\x00\x00"
                                              "aq\x01K\x01X\x01\x00\x00\x00"
                                              "bq\x02]q\x03(\x88NG?\xf8\x00"
                                              "\x00\x00\x00\x00\x00"
                                              "eu."));
}

TEST(Writer, Protocol4DictExactBytes) {
  EXPECT_EQ(write(*small_dict(), 4), bytes_of("\x80\x04\x95\x1e\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01"
                                              "a\x94K\x01\x8c\x01"
                                              "b\x94]\x94(\x88NG?"
                                              "\xf8\x00\x00\x00\x00\x00\x00"
                                              "eu."));
}

TEST(Writer, TuplesExactBytes) {
  auto v = Value::list({Value::tuple(), Value::tuple({Value::integer(1)}),
                        Value::tuple({Value::integer(1), Value::integer(2)}),
                        Value::tuple({Value::integer(1), Value::integer(2), Value::integer(3)}),
                        Value::tuple({Value::integer(1), Value::integer(2), Value::integer(3), Value::integer(4)})});
  EXPECT_EQ(write(*v, 2),
            bytes_of("\x80\x02]q\x00()K\x01\x85q\x01K\x01K\x02\x86q\x02K\x01K\x02K\x03\x87q\x03(K\x01K\x02"
                     "K\x03K\x04tq\x04"
                     "e."));
  EXPECT_EQ(write(*v, 4),
            bytes_of("\x80\x04\x95#\x00\x00\x00\x00\x00\x00\x00]\x94()K\x01\x85\x94K\x01K\x02\x86\x94K\x01"
                     "K\x02K\x03\x87\x94(K\x01K\x02K\x03K\x04t\x94"
                     "e."));
}

TEST(Writer, ObjectsExactBytes) {
  auto od = Value::call("collections", "OrderedDict", {});
  od->mutable_entries().push_back({Value::str("a"), Value::integer(1)});
  EXPECT_EQ(write(*od, 2), bytes_of("\x80\x02"
                                    "ccollections\nOrderedDict\nq\x00)Rq\x01X\x01\x00\x00\x00"
                                    "aq\x02K\x01s."));
  auto ns = Value::object(CallKind::kNewObj, Value::global("argparse", "Namespace"), Value::tuple());
  ns->set_state(Value::dict({{Value::str("lr"), Value::floating(0.5)}}));
  EXPECT_EQ(write(*ns, 4), bytes_of("\x80\x04\x95/\x00\x00\x00\x00\x00\x00\x00\x8c\x08"
                                    "argparse\x94\x8c\x09Namespace"
                                    "\x94\x93\x94)\x81\x94}\x94\x8c\x02lr\x94G?\xe0\x00\x00\x00\x00\x00\x00sb."));
  // A nested name needs getattr below protocol 4.
  EXPECT_EQ(write(*Value::global("collections", "OrderedDict.fromkeys"), 2),
            bytes_of("\x80\x02"
                     "c__builtin__\ngetattr\nq\x00"
                     "ccollections\nOrderedDict\nq\x01X\x08\x00\x00\x00"
                     "fromkeysq\x02\x86q\x03Rq\x04."));
}

TEST(Writer, SharedAndCyclicExactBytes) {
  auto inner = ints({1});
  EXPECT_EQ(write(*Value::list({inner, inner}), 2), bytes_of("\x80\x02]q\x00(]q\x01K\x01"
                                                             "ah\x01"
                                                             "e."));
  auto self = Value::list();
  self->mutable_items().push_back(self);
  EXPECT_EQ(write(*self, 2), bytes_of("\x80\x02]q\x00h\x00"
                                      "a."));
  EXPECT_EQ(write(*self, 4), bytes_of("\x80\x04\x95\x06\x00\x00\x00\x00\x00\x00\x00]\x94h\x00"
                                      "a."));
  // t = (l,); l.append(t): the tuple is recalled from the memo, as CPython does.
  auto l = Value::list();
  auto t = Value::tuple({l});
  l->mutable_items().push_back(t);
  EXPECT_EQ(write(*t, 2), bytes_of("\x80\x02]q\x00h\x00\x85q\x01"
                                   "a0h\x01."));
  self->mutable_items().clear();  // break the cycles for LeakSanitizer
  l->mutable_items().clear();
}

// Pickles CPython wrote come out byte for byte the same after read + write.
TEST(Writer, RewritesCPythonPicklesIdentically) {
  const std::vector<std::pair<int, std::string>> cases = {
      {2, bytes_of("\x80\x02]q\x00(c_codecs\nencode\nq\x01X\x02\x00\x00\x00"
                   "abq\x02X\x06\x00\x00\x00latin1q\x03\x86q"
                   "\x04Rq\x05"
                   "c__builtin__\nbytes\nq\x06)Rq\x07"
                   "c__builtin__\nbytearray\nq\x08h\x01X\x03\x00\x00\x00x"
                   "\xc3\xbfq\x09h\x03\x86q\nRq\x0b\x85q\x0cRq\x0d"
                   "c__builtin__\nset\nq\x0e]q\x0fK\x01"
                   "a\x85q\x10Rq\x11"
                   "c__builtin__\nfrozenset\nq\x12]q\x13K\x02"
                   "a\x85q\x14Rq\x15"
                   "e.")},
      {4, bytes_of("\x80\x04\x95:\x00\x00\x00\x00\x00\x00\x00]\x94(C\x02"
                   "ab\x94"
                   "C\x00\x94\x8c\x08"
                   "builtins\x94\x8c"
                   "\x09"
                   "bytearray\x94\x93\x94"
                   "C\x02x\xff\x94\x85\x94R\x94\x8f\x94(K\x01\x90(K\x02\x91\x94"
                   "e.")},
      {2, bytes_of("\x80\x02"
                   "cargparse\nNamespace\nq\x00)\x81q\x01}q\x02X\x02\x00\x00\x00lrq\x03G?\xe0\x00\x00\x00"
                   "\x00\x00\x00sb.")},
      {4, bytes_of("\x80\x04\x95)\x00\x00\x00\x00\x00\x00\x00\x8c\x0b"
                   "collections\x94\x8c\x0bOrderedDict\x94\x93\x94)R"
                   "\x94\x8c\x01"
                   "a\x94K\x01s.")},
  };
  for (const auto& [protocol, original] : cases) {
    EXPECT_EQ(write(*read(original), protocol), original);
  }
}

TEST(Writer, Protocol4LargePayloadsAndFrames) {
  auto v = Value::list({Value::str(std::string(300, 'x')), Value::bytes(std::string(300, 'y'))});
  std::string expected = bytes_of("\x80\x04\x95i\x02\x00\x00\x00\x00\x00\x00]\x94(X,\x01\x00\x00") +
                         std::string(300, 'x') +
                         bytes_of("\x94"
                                  "B,\x01\x00\x00") +
                         std::string(300, 'y') +
                         bytes_of("\x94"
                                  "e.");
  EXPECT_EQ(write(*v, 4), expected);
  // A payload of 64 KiB or more is written outside any frame; the rest stays framed.
  auto large = Value::list({Value::bytes(std::string(70000, 'z')), Value::integer(1)});
  std::string out = write(*large, 4);
  EXPECT_EQ(out.substr(0, 5), bytes_of("\x80\x04]\x94("));  // 3-byte frame: no FRAME header
  EXPECT_EQ(out.substr(5, 5), bytes_of("B\x70\x11\x01\x00"));
  EXPECT_TRUE(deep_equal(*read(out), *large));
  // Many small items: frames of about 64 KiB.
  std::vector<ValuePtr> many;
  for (int i = 0; i < 30000; ++i) many.push_back(Value::str("item" + std::to_string(i)));
  auto list = Value::list(std::move(many));
  std::string framed = write(*list, 4);
  EXPECT_EQ(static_cast<unsigned char>(framed[2]), 0x95);
  EXPECT_LT(get_le<std::uint64_t>(reinterpret_cast<const std::byte*>(framed.data() + 3)), 70000u);
  EXPECT_TRUE(deep_equal(*read(framed), *list));
}

// Batches as CPython's C pickler writes them (checked against pickle.dumps).
TEST(Writer, BatchesOf1000) {
  std::string out = write(*ints(std::vector<std::int64_t>(1001, 7)), 2);
  // PROTO ] q0 ( K7*1000 e ( K7 e .
  ASSERT_EQ(out.size(), 2u + 1 + 2 + 1 + 2000 + 1 + 1 + 2 + 1 + 1);
  EXPECT_EQ(out[6 + 2000], 'e');
  EXPECT_EQ(out.substr(out.size() - 5), bytes_of("(K\x07"
                                                 "e."));
  EXPECT_EQ(write(*ints({7}), 2), bytes_of("\x80\x02]q\x00K\x07"
                                           "a."));
  // A dict of exactly 1000 items ends with an empty batch.
  DictEntries entries;
  for (int i = 0; i < 1000; ++i) entries.push_back({Value::integer(i), Value::integer(1)});
  std::string dict = write(*Value::dict(entries), 2);
  EXPECT_EQ(dict.substr(dict.size() - 6), bytes_of("K\x01u(u."));
  // Items set on an object end with SETITEM for a last batch of one, as CPython's iterator path.
  auto od = Value::call("collections", "OrderedDict", {});
  entries.push_back({Value::integer(1000), Value::integer(1)});
  od->mutable_entries() = entries;
  std::string object = write(*od, 2);
  EXPECT_EQ(object.substr(object.size() - 8), bytes_of("uM\xe8\x03K\x01s."));
}

ValuePtr sample_tree() {
  auto shared = Value::str("shared");
  auto od = Value::call("collections", "OrderedDict", {});
  od->mutable_entries().push_back({Value::str("w"), Value::floating(-0.0)});
  auto obj = Value::object(CallKind::kNewObj, Value::global("mod", "Cls"), Value::tuple());
  obj->set_state(Value::tuple({Value::global("torch", "float32"), Value::boolean(false)}));
  auto ex = Value::object(CallKind::kNewObjEx, Value::global("mod", "Cls"), Value::tuple({Value::integer(1)}),
                          Value::dict({{Value::str("k"), Value::none()}}));
  auto pid = Value::persistent_id(Value::tuple({Value::str("storage"), Value::global("torch", "FloatStorage"),
                                                Value::str("0"), Value::str("cpu"), Value::integer(6)}));
  return Value::dict({
      {Value::str("ints"), ints({0, -1, 1 << 20, INT64_MIN, INT64_MAX})},
      {Value::str("big"), Value::list({big(100, false), big(70, true), big(2100, false)})},
      {Value::str("floats"), Value::list({Value::floating(NAN), Value::floating(INFINITY), Value::floating(1e-300)})},
      {Value::str("text"), Value::list({shared, shared, Value::str(""), Value::str("\xed\xa0\x80")})},
      {Value::str("bytes"), Value::list({Value::bytes(""), Value::bytes(std::string("\x00\xff\x80", 3)),
                                         Value::bytearray(""), Value::bytearray("ab")})},
      {Value::str("sets"), Value::list({Value::set(), Value::set({Value::integer(1)}), Value::frozenset(),
                                        Value::frozenset({Value::str("a"), Value::integer(2)})})},
      {Value::str("objects"), Value::list({od, obj, ex, pid, Value::global("a.b", "C.D.e")})},
      {Value::integer(5), Value::tuple({Value::tuple(), Value::tuple({shared})})},
  });
}

TEST(Writer, RoundTripsBothProtocols) {
  auto tree = sample_tree();
  for (int protocol : {2, 4}) {
    auto back = read(write(*tree, protocol));
    if (protocol == 4) {
      EXPECT_TRUE(deep_equal(*back, *tree)) << "protocol " << protocol;
    } else {
      // Protocol 2 spells the nested global a.b C.D.e as getattr(getattr(C, 'D'), 'e').
      auto objects = back->get("objects");
      auto nested = objects->items().back();
      EXPECT_TRUE(nested->is(Kind::kObject));
      EXPECT_TRUE(nested->callable()->is_global("builtins", "getattr"));
      objects->mutable_items().back() = Value::global("a.b", "C.D.e");
      EXPECT_TRUE(deep_equal(*back, *tree)) << "protocol " << protocol;
    }
    // Sharing survives: both "shared" entries are one node.
    auto text = back->get("text");
    EXPECT_EQ(text->items()[0], text->items()[1]);
  }
}

TEST(Writer, CyclesRoundTrip) {
  // d = {'self': d, 'list': l}, l = [d, (l,)], o = Obj() with o.state = {'o': o}
  auto d = Value::dict();
  auto l = Value::list();
  auto o = Value::object(CallKind::kNewObj, Value::global("m", "O"), Value::tuple());
  o->set_state(Value::dict({{Value::str("o"), o}}));
  d->mutable_entries().push_back({Value::str("self"), d});
  d->mutable_entries().push_back({Value::str("list"), l});
  d->mutable_entries().push_back({Value::str("obj"), o});
  l->mutable_items().push_back(d);
  l->mutable_items().push_back(Value::tuple({l}));
  auto s = Value::set();
  s->mutable_items().push_back(Value::tuple({Value::integer(1)}));
  for (int protocol : {2, 4}) {
    auto back = read(write(*d, protocol));
    EXPECT_TRUE(deep_equal(*back, *d));
    EXPECT_EQ(back->get("self").get(), back.get());
    EXPECT_EQ(back->get("list")->items()[0].get(), back.get());
    auto obj = back->get("obj");
    EXPECT_EQ(obj->state()->get("o"), obj);
  }
  for (auto* node : {d.get(), l.get(), o.get()}) {
    node->mutable_entries().clear();
    node->mutable_items().clear();
  }
  o->set_state(nullptr);
}

// t = (big, l1, ..., l200) with every li = [t]: t is met again inside each li, nested,
// and each time it writes its children again. The big unshared child must come from the
// memo after the first time, as CPython writes it: same size as pickle.dumps(t, p).
TEST(Writer, RecursiveTupleWritesChildrenOnce) {
  auto big = ints(std::vector<std::int64_t>(1000, 7));
  std::vector<ValuePtr> items{big};
  std::vector<ValuePtr> lists;
  for (int i = 0; i < 200; ++i) lists.push_back(Value::list());
  items.insert(items.end(), lists.begin(), lists.end());
  auto t = Value::tuple(std::move(items));
  for (auto& l : lists) l->mutable_items().push_back(t);
  big.reset();  // t holds the only reference
  for (auto [protocol, cpython_size] : {std::pair{2, 84012u}, std::pair{4, 83828u}}) {
    std::string out = write(*t, protocol);
    EXPECT_EQ(out.size(), cpython_size) << "protocol " << protocol;
    EXPECT_TRUE(deep_equal(*read(out), *t));
  }
  for (auto& l : lists) l->mutable_items().clear();
}

TEST(Writer, UsageErrors) {
  EXPECT_THROW(write(*Value::none(), 3), UsageError);
  EXPECT_THROW(write(*Value::none(), 5), UsageError);
  // A tuple that contains itself: Python cannot pickle it either.
  auto t = Value::tuple();
  t->mutable_items().push_back(t);
  EXPECT_THROW(write(*t, 2), UsageError);
  t->mutable_items().clear();
  // An object whose arguments contain the object.
  auto args = Value::tuple();
  auto o = Value::object(CallKind::kReduce, Value::global("m", "f"), args);
  args->mutable_items().push_back(o);
  EXPECT_THROW(write(*o, 4), UsageError);
  args->mutable_items().clear();
  // A set that reaches itself through a tuple needs protocol 4.
  auto s = Value::set();
  s->mutable_items().push_back(Value::tuple({s}));
  EXPECT_THROW(write(*s, 2), UsageError);
  EXPECT_TRUE(deep_equal(*read(write(*s, 4)), *s));
  s->mutable_items().clear();
  EXPECT_THROW(write(*Value::str("\xff"), 2), UsageError);
  EXPECT_THROW(write(*Value::object(CallKind::kReduce, Value::global("m", "f"), Value::list()), 2), UsageError);
  EXPECT_THROW(write(*Value::global("m\n", "f"), 2), UsageError);
  EXPECT_THROW(write(*Value::list({nullptr}), 2), UsageError);
}

// A protocol-3 pickle keeps Python 2 module names (no fix_imports), and a protocol-2
// reader would take them for Python 3's: such a global is written at protocol 4 only.
TEST(Writer, Python2ModuleGlobalsAreRefusedAtProtocol2) {
  ValuePtr kept = read(std::string("\x80\x03"
                                   "c__builtin__\nfrozenset\n."));
  ASSERT_TRUE(kept->is_global("__builtin__", "frozenset"));
  EXPECT_TRUE(read(std::string("\x80\x02"
                               "c__builtin__\nfrozenset\n."))
                  ->is_global("builtins", "frozenset"));
  for (const char* module : {"__builtin__", "copy_reg", "exceptions"}) {
    ValuePtr g = Value::global(module, "f");
    EXPECT_THROW(write(*g, 2), UsageError) << module;
    EXPECT_THROW(write(*Value::global(module, "A.f"), 2), UsageError) << module;
    EXPECT_TRUE(deep_equal(*read(write(*g, 4)), *g)) << module;
  }
  EXPECT_TRUE(read(write(*Value::global("builtins", "frozenset"), 2))->is_global("builtins", "frozenset"));
}

TEST(Writer, DepthIsGuarded) {
  ValuePtr deep = Value::list();
  for (int i = 0; i < 5999; ++i) deep = Value::list({deep});
  EXPECT_TRUE(deep_equal(*read(write(*deep, 2), ReadOptions{.max_depth = 6000}), *deep));
  deep = Value::tuple({deep});
  EXPECT_THROW(write(*deep, 2), UsageError);
  for (int i = 0; i < 100000; ++i) deep = Value::list({deep});
  EXPECT_THROW(write(*deep, 4), UsageError);
}

TEST(Writer, WritesToAnySink) {
  StringSink sink;
  sink.write(std::string_view("prefix"));
  write_pickle(*Value::integer(1), sink, WriteOptions{.protocol = 2});
  EXPECT_EQ(sink.str(), bytes_of("prefix\x80\x02K\x01."));
}

}  // namespace
}  // namespace shardpoint::pickle
