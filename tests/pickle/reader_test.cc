#include "pickle/reader.h"

#include <gtest/gtest.h>

#include <cmath>

#include "pickle/opcodes.h"
#include "pickle/repr.h"
#include "pickle_test_util.h"
#include "shardpoint/error.h"

namespace shardpoint::pickle {
namespace {

using testing::bytes_of;
using testing::read;

// Expects FormatError whose message contains every fragment.
void expect_format_error(std::string_view data, std::initializer_list<std::string_view> fragments,
                         const ReadOptions& options = {}) {
  try {
    read(data, options);
    ADD_FAILURE() << "no FormatError for " << ::testing::PrintToString(std::string(data));
  } catch (const FormatError& e) {
    std::string message = e.what();
    for (auto fragment : fragments) EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

// pickle.dumps({'a': (1, 2), 'b': [True, None, -1, 300, -300, 70000, 2**31, -2**31-1]}, p)
const std::string kDictP2 =
    bytes_of("\x80\x02}q\x00(X\x01\x00\x00\x00"
             "aq\x01K\x01K\x02\x86q\x02X\x01\x00\x00\x00"
             "bq\x03]q\x04(\x88NJ"
             "\xff\xff\xff\xffM,\x01J\xd4\xfe\xff\xffJp\x11\x01\x00\x8a\x05\x00\x00\x00\x80\x00\x8a\x05\xff\xff\xff"
             "\x7f\xff"
             "eu.");
const std::string kDictP0 =
    bytes_of("(dp0\nVa\np1\n(I1\nI2\ntp2\nsVb\np3\n(lp4\nI01\naNaI-1\naI300\naI-300\naI70000\naL2147483648L\n"
             "aL-2147483649L\nas.");

void expect_dict_case(const Value& root) {
  ASSERT_TRUE(root.is(Kind::kDict));
  ASSERT_EQ(root.entries().size(), 2u);
  auto a = root.get("a");
  ASSERT_TRUE(a && a->is(Kind::kTuple));
  ASSERT_EQ(a->items().size(), 2u);
  EXPECT_EQ(a->items()[0]->as_int(), 1);
  EXPECT_EQ(a->items()[1]->as_int(), 2);
  auto b = root.get("b");
  ASSERT_TRUE(b && b->is(Kind::kList));
  const auto& l = b->items();
  ASSERT_EQ(l.size(), 8u);
  EXPECT_TRUE(l[0]->as_bool());
  EXPECT_TRUE(l[1]->is_none());
  EXPECT_EQ(l[2]->as_int(), -1);
  EXPECT_EQ(l[3]->as_int(), 300);
  EXPECT_EQ(l[4]->as_int(), -300);
  EXPECT_EQ(l[5]->as_int(), 70000);
  EXPECT_EQ(l[6]->as_int(), 2147483648);
  EXPECT_EQ(l[7]->as_int(), -2147483649);
}

TEST(Reader, Protocol2Dict) { expect_dict_case(*read(kDictP2)); }

TEST(Reader, Protocol0Dict) { expect_dict_case(*read(kDictP0)); }

TEST(Reader, Protocol4FramesStackGlobalMemoize) {
  // collections.OrderedDict(a=1), protocol 4.
  auto root = read(bytes_of("\x80\x04\x95)\x00\x00\x00\x00\x00\x00\x00\x8c\x0b"
                            "collections\x94\x8c\x0bOrderedDict"
                            "\x94\x93\x94)R\x94\x8c\x01"
                            "a\x94K\x01s."));
  ASSERT_TRUE(root->is(Kind::kObject));
  EXPECT_EQ(root->call_kind(), CallKind::kReduce);
  EXPECT_TRUE(root->callable()->is_global("collections", "OrderedDict"));
  EXPECT_TRUE(root->args()->items().empty());
  ASSERT_EQ(root->entries().size(), 1u);
  EXPECT_EQ(root->entries()[0].first->as_string(), "a");
  EXPECT_EQ(root->entries()[0].second->as_int(), 1);
}

TEST(Reader, NewObjAndBuild) {
  // argparse.Namespace(lr=0.5), protocol 2.
  auto root = read(bytes_of("\x80\x02"
                            "cargparse\nNamespace\nq\x00)\x81q\x01}q\x02X\x02\x00\x00\x00lrq\x03G?\xe0\x00\x00"
                            "\x00\x00\x00\x00sb."));
  ASSERT_TRUE(root->is(Kind::kObject));
  EXPECT_EQ(root->call_kind(), CallKind::kNewObj);
  EXPECT_TRUE(root->callable()->is_global("argparse", "Namespace"));
  ASSERT_TRUE(root->state());
  EXPECT_EQ(root->state()->get("lr")->as_float(), 0.5);
}

void expect_bytes_set_case(const Value& root) {
  ASSERT_TRUE(root.is(Kind::kList));
  const auto& l = root.items();
  ASSERT_EQ(l.size(), 5u);
  EXPECT_TRUE(l[0]->is(Kind::kBytes));
  EXPECT_EQ(l[0]->as_string(), "ab");
  EXPECT_TRUE(l[1]->is(Kind::kBytes));
  EXPECT_EQ(l[1]->as_string(), "");
  EXPECT_TRUE(l[2]->is(Kind::kByteArray));
  EXPECT_EQ(l[2]->as_string(), "x\xff");
  ASSERT_TRUE(l[3]->is(Kind::kSet));
  ASSERT_EQ(l[3]->items().size(), 1u);
  EXPECT_EQ(l[3]->items()[0]->as_int(), 1);
  ASSERT_TRUE(l[4]->is(Kind::kFrozenSet));
  EXPECT_EQ(l[4]->items()[0]->as_int(), 2);
}

// [b'ab', b'', bytearray(b'x\xff'), {1}, frozenset({2})] in protocols 0, 2, 4 and 5: the
// reduce spellings of older protocols become the same tree as the opcodes of newer ones.
TEST(Reader, BytesAndSetsAllProtocols) {
  expect_bytes_set_case(*read(bytes_of(
      "(lp0\nc_codecs\nencode\np1\n(Vab\np2\nVlatin1\np3\ntp4\nRp5\nac__builtin__\nbytes\np6\n(tRp7\nac__builtin__\n"
      "bytearray\np8\n(g1\n(Vx\xff\np9\ng3\ntp10\nRp11\ntp12\nRp13\nac__builtin__\nset\np14\n((lp15\nI1\natp16\nRp17\n"
      "ac__builtin__\nfrozenset\np18\n((lp19\nI2\natp20\nRp21\na.")));
  expect_bytes_set_case(*read(bytes_of("\x80\x02]q\x00(c_codecs\nencode\nq\x01X\x02\x00\x00\x00"
                                       "abq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05"
                                       "c__builtin__\nbytes\nq\x06)Rq\x07"
                                       "c__builtin__\nbytearray\nq\x08h\x01X\x03\x00\x00\x00x\xc3\xbfq\x09h\x03\x86q\n"
                                       "Rq\x0b\x85q\x0cRq\x0d"
                                       "c__builtin__\nset\nq\x0e]q\x0fK\x01"
                                       "a\x85q\x10Rq\x11"
                                       "c__builtin__\nfrozenset\nq\x12]"
                                       "q\x13K\x02"
                                       "a\x85q\x14Rq\x15"
                                       "e.")));
  expect_bytes_set_case(*read(bytes_of("\x80\x04\x95:\x00\x00\x00\x00\x00\x00\x00]\x94(C\x02"
                                       "ab\x94"
                                       "C\x00\x94\x8c\x08"
                                       "builtins\x94\x8c\x09"
                                       "bytearray\x94\x93\x94"
                                       "C\x02x\xff\x94\x85\x94R\x94\x8f\x94(K\x01\x90(K\x02\x91\x94"
                                       "e.")));
  expect_bytes_set_case(*read(bytes_of("\x80\x05\x95$\x00\x00\x00\x00\x00\x00\x00]\x94(C\x02"
                                       "ab\x94"
                                       "C\x00\x94\x96\x02\x00\x00\x00\x00\x00\x00\x00"
                                       "x\xff\x94\x8f\x94(K\x01\x90(K\x02\x91\x94"
                                       "e.")));
}

void expect_text_case(const Value& root) {
  ASSERT_TRUE(root.is(Kind::kList));
  const auto& l = root.items();
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0]->as_float(), 1.5);
  EXPECT_EQ(l[1]->as_string(), "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(repr(*l[2]), "1267650600228229401496703205376");
  EXPECT_EQ(repr(*l[3]), "-1180591620717411303424");
}

// [1.5, 'café 😀', 2**100, -2**70] in protocols 0 and 1.
TEST(Reader, TextAndBigInts) {
  expect_text_case(*read(bytes_of(
      "(lp0\nF1.5\naVcaf\xe9 \\U0001f600\np1\naL1267650600228229401496703205376L\naL-1180591620717411303424L\na.")));
  expect_text_case(*read(bytes_of("]q\x00(G?\xf8\x00\x00\x00\x00\x00\x00X\n\x00\x00\x00"
                                  "caf\xc3\xa9 \xf0\x9f\x98\x80q\x01"
                                  "L1267650600228229401496703205376L\nL-1180591620717411303424L\ne.")));
}

TEST(Reader, LongOpcodes) {
  auto v = read(bytes_of("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01."));  // 2**64 via LONG1
  EXPECT_FALSE(v->int_fits_int64());
  EXPECT_EQ(repr(*v), "18446744073709551616");
  v = read(bytes_of("\x80\x02\x8b\x02\x00\x00\x00\xff\x7f."));  // LONG4
  EXPECT_EQ(v->as_int(), 0x7fff);
  EXPECT_EQ(read(bytes_of("\x80\x02\x8a\x00."))->as_int(), 0);
  expect_format_error(bytes_of("\x80\x02\x8b\xff\xff\xff\xff."), {"LONG4", "negative length"});
}

TEST(Reader, TextOpcodes) {
  EXPECT_EQ(read("I-42\n.")->as_int(), -42);
  EXPECT_FALSE(read("I00\n.")->as_bool());
  EXPECT_EQ(read("L123L\n.")->as_int(), 123);
  EXPECT_EQ(read("L1_000\n.")->as_int(), 1000);
  EXPECT_TRUE(std::isnan(read("Fnan\n.")->as_float()));
  EXPECT_EQ(read("F-inf\n.")->as_float(), -INFINITY);
  EXPECT_EQ(read("F1e-05\n.")->as_float(), 1e-05);
  EXPECT_EQ(read("F1e400\n.")->as_float(), INFINITY);
  // STRING: Python 2 str with escapes; ASCII becomes str, other bytes stay bytes.
  auto s = read("S'a\\'b\\x41\\101\\n'\n.");
  EXPECT_TRUE(s->is(Kind::kStr));
  EXPECT_EQ(s->as_string(), "a'bAA\n");
  auto b = read("S\"\\xff\"\n.");
  EXPECT_TRUE(b->is(Kind::kBytes));
  EXPECT_EQ(b->as_string(), "\xff");
  // UNICODE: raw-unicode-escape; an even backslash run does not escape.
  EXPECT_EQ(read("V\\u20ac\\\\u0041\\U0001F600\n.")->as_string(), "\xe2\x82\xac\\\\u0041\xf0\x9f\x98\x80");
  auto pid = read("Pkey1\n.");
  ASSERT_TRUE(pid->is(Kind::kPersistentId));
  EXPECT_EQ(pid->pid()->as_string(), "key1");
  expect_format_error("S'abc\n.", {"STRING", "quoted"});
  expect_format_error("Iabc\n.", {"INT", "decimal integer"});
  expect_format_error("Fabc\n.", {"FLOAT"});
  expect_format_error("V\\u12\n.", {"UNICODE"});
  expect_format_error("I1", {"INT", "newline"});
  expect_format_error("L" + std::string(5000, '9') + "\n.", {"LONG", "4300"});
}

TEST(Reader, BinaryStringsAndBytes) {
  EXPECT_EQ(read(bytes_of("T\x02\x00\x00\x00hi."))->as_string(), "hi");
  EXPECT_EQ(read(bytes_of("U\x02hi."))->as_string(), "hi");
  EXPECT_EQ(read(bytes_of("\x80\x03"
                          "B\x01\x00\x00\x00z."))
                ->as_string(),
            "z");
  auto b8 = read(bytes_of("\x80\x04\x8e\x01\x00\x00\x00\x00\x00\x00\x00z."));
  EXPECT_TRUE(b8->is(Kind::kBytes));
  auto u8 = read(bytes_of("\x80\x04\x8d\x01\x00\x00\x00\x00\x00\x00\x00z."));
  EXPECT_TRUE(u8->is(Kind::kStr));
  EXPECT_EQ(u8->as_string(), "z");
  // Lone surrogates pass (as Python's surrogatepass); malformed UTF-8 does not.
  EXPECT_EQ(read(bytes_of("X\x03\x00\x00\x00\xed\xa0\x80."))->as_string(), "\xed\xa0\x80");
  expect_format_error(bytes_of("X\x02\x00\x00\x00\xc3\x28."), {"BINUNICODE", "UTF-8"});
  expect_format_error(bytes_of("X\x02\x00\x00\x00\xc0\x80."), {"UTF-8"});  // overlong
}

TEST(Reader, StackOpcodes) {
  // POP, DUP, POP_MARK, and POP of an empty frame popping the MARK (as CPython).
  auto v = read(bytes_of("\x80\x02K\x01K\x02"
                         "0(K\x03K\x04"
                         "1(0K\x05"
                         "2\x87."));
  ASSERT_EQ(v->items().size(), 3u);
  EXPECT_EQ(v->items()[0]->as_int(), 1);
  EXPECT_EQ(v->items()[1]->as_int(), 5);
  EXPECT_EQ(v->items()[1], v->items()[2]);  // DUP shares the node
}

TEST(Reader, MarkOpcodesProtocol0) {
  // DICT, LIST, TUPLE with MARK; GET/PUT in text form.
  auto v = read("((S'k'\np1\nI1\ndp2\n(g1\nltp3\n.");
  ASSERT_TRUE(v->is(Kind::kTuple));
  ASSERT_EQ(v->items().size(), 2u);
  EXPECT_EQ(v->items()[0]->get("k")->as_int(), 1);
  ASSERT_TRUE(v->items()[1]->is(Kind::kList));
  EXPECT_EQ(v->items()[1]->items()[0], v->items()[0]->entries()[0].first);  // memo shares the key
}

TEST(Reader, MemoSharingAndLongIndices) {
  auto v = read(bytes_of("\x80\x02]r\xff\xff\xff\xffj\xff\xff\xff\xff\x86."));
  ASSERT_TRUE(v->is(Kind::kTuple));
  EXPECT_EQ(v->items()[0], v->items()[1]);
  expect_format_error(bytes_of("\x80\x02h\x05."), {"BINGET", "memo index 5 not found", "offset 2"});
  expect_format_error(bytes_of("\x80\x02q\x00."), {"BINPUT", "stack underflow"});
  // MEMOIZE uses the memo's size as its index.
  auto m = read(bytes_of("\x80\x04K\x07\x94"
                         "0h\x00."));
  EXPECT_EQ(m->as_int(), 7);
  // Index 100 put while the memo is nearly empty, then 40 dense entries and index 105 (the
  // dense table now spans 100): index 100 still holds its value.
  std::string grown = std::string("\x80\x02K\x01q\x64"
                                  "0",
                                  7);
  for (int i = 0; i < 40; ++i) grown += std::string("K\x02q", 3) + static_cast<char>(i) + "0";
  grown += std::string("K\x03q\x69"
                       "0h\x64.",
                       8);
  EXPECT_EQ(read(grown)->as_int(), 1);
}

TEST(Reader, SetsAndFrozenSets) {
  auto s = read(bytes_of("\x80\x04\x8f(K\x01K\x02\x90(K\x03\x90."));
  ASSERT_TRUE(s->is(Kind::kSet));
  EXPECT_EQ(s->items().size(), 3u);
  auto f = read(bytes_of("\x80\x04(K\x01\x91."));
  ASSERT_TRUE(f->is(Kind::kFrozenSet));
  expect_format_error(bytes_of("\x80\x04](K\x01\x90."), {"ADDITEMS", "expected a set"});
}

TEST(Reader, InstObjAndNewObjEx) {
  auto inst = read("(I1\nimod\nCls\n.");
  ASSERT_TRUE(inst->is(Kind::kObject));
  EXPECT_EQ(inst->call_kind(), CallKind::kReduce);
  EXPECT_TRUE(inst->callable()->is_global("mod", "Cls"));
  EXPECT_EQ(inst->args()->items()[0]->as_int(), 1);
  auto empty_inst = read("(imod\nCls\n.");
  EXPECT_EQ(empty_inst->call_kind(), CallKind::kNewObj);
  auto obj = read("(cmod\nCls\nI2\no.");
  EXPECT_TRUE(obj->callable()->is_global("mod", "Cls"));
  EXPECT_EQ(obj->args()->items()[0]->as_int(), 2);
  expect_format_error("(o.", {"OBJ", "class"});
  auto ex = read(bytes_of("\x80\x04\x8c\x03mod\x8c\x03"
                          "Cls\x93K\x01\x85}\x8c\x01kK\x02s\x92."));
  EXPECT_EQ(ex->call_kind(), CallKind::kNewObjEx);
  EXPECT_EQ(ex->kwargs()->get("k")->as_int(), 2);
  // Protocol 2 spelling: copyreg.__newobj_ex__(cls, args, kwargs).
  auto ex2 = read(bytes_of("\x80\x02"
                           "ccopy_reg\n__newobj_ex__\ncmod\nCls\nK\x01\x85}\x87R."));
  EXPECT_EQ(ex2->call_kind(), CallKind::kNewObjEx);
  EXPECT_TRUE(ex2->callable()->is_global("mod", "Cls"));
}

TEST(Reader, PersistentIds) {
  auto v = read(bytes_of("\x80\x02(X\x07\x00\x00\x00storageK\x06tQ."));
  ASSERT_TRUE(v->is(Kind::kPersistentId));
  EXPECT_EQ(v->pid()->items()[0]->as_string(), "storage");
}

TEST(Reader, ObjectsTakeAppendsAndSetItems) {
  auto v = read(bytes_of("\x80\x02"
                         "cmod\nL\n)R(K\x01K\x02"
                         "eK\x03"
                         "aX\x01\x00\x00\x00kK\x04sN."));
  EXPECT_TRUE(v->is_none());
  auto o = read(bytes_of("\x80\x02"
                         "cmod\nL\n)R(K\x01K\x02"
                         "eK\x03"
                         "aX\x01\x00\x00\x00kK\x04s."));
  EXPECT_EQ(o->items().size(), 3u);
  EXPECT_EQ(o->entries().size(), 1u);
  expect_format_error(bytes_of("\x80\x02)K\x01"
                               "a."),
                      {"APPEND", "tuple"});
  expect_format_error(bytes_of("\x80\x02]K\x01K\x02s."), {"SETITEM", "list"});
  expect_format_error(bytes_of("\x80\x02}(K\x01u."), {"SETITEMS", "odd"});
  expect_format_error(bytes_of("\x80\x02]}b."), {"BUILD", "expected an object"});
  expect_format_error(bytes_of("\x80\x02"
                               "cm\nC\n)\x81}b}b."),
                      {"BUILD", "already"});
  expect_format_error(bytes_of("\x80\x02"
                               "cm\nC\nK\x01R."),
                      {"REDUCE", "argument tuple"});
}

TEST(Reader, FixImportsOnlyBelowProtocol3) {
  EXPECT_TRUE(read("c__builtin__\nlong\n.")->is_global("builtins", "int"));
  EXPECT_TRUE(read(bytes_of("\x80\x02\x8c\x0b__builtin__\x8c\x07unicode\x93."))->is_global("builtins", "str"));
  EXPECT_TRUE(read(bytes_of("\x80\x04\x8c\x0b__builtin__\x8c\x07unicode\x93."))->is_global("__builtin__", "unicode"));
  EXPECT_TRUE(read(bytes_of("\x80\x02"
                            "ccopy_reg\n_reconstructor\n."))
                  ->is_global("copyreg", "_reconstructor"));
  EXPECT_TRUE(read(bytes_of("\x80\x03"
                            "c__builtin__\nset\n."))
                  ->is_global("__builtin__", "set"));
}

TEST(Reader, UnsupportedOpcodes) {
  expect_format_error(bytes_of("\x80\x05\x97."), {"NEXT_BUFFER", "out-of-band buffers not supported"});
  expect_format_error(bytes_of("\x80\x05\x98."), {"READONLY_BUFFER", "out-of-band"});
  expect_format_error(bytes_of("\x80\x02\x82\x01."), {"EXT1", "extension"});
  expect_format_error(bytes_of("\x80\x02\x83\x01\x00."), {"EXT2", "extension"});
  expect_format_error(bytes_of("\x80\x02\x84\x01\x00\x00\x00."), {"EXT4", "extension"});
  expect_format_error(bytes_of("\x80\x02\xff."), {"opcode 0xff at offset 2"});
  expect_format_error(bytes_of("\x80\x06N."), {"PROTO", "unsupported protocol 6"});
  expect_format_error(bytes_of("\x80\x02\x93."), {"STACK_GLOBAL", "stack underflow"});
  expect_format_error(bytes_of("\x80\x04K\x01K\x02\x93."), {"STACK_GLOBAL", "str"});
}

// Every opcode of pickletools (CPython 3.11: 68) has a name here, so errors can name it.
TEST(Reader, KnowsEveryOpcodeName) {
  int named = 0;
  for (int code = 0; code < 256; ++code) named += op::opcode_name(static_cast<std::uint8_t>(code)).empty() ? 0 : 1;
  EXPECT_EQ(named, 68);
  EXPECT_EQ(op::opcode_name(op::kBinUnicode8), "BINUNICODE8");
}

TEST(Reader, ErrorsNameSourceOffsetAndExpectation) {
  try {
    read_pickle(as_bytes(bytes_of("\x80\x02X\x05\x00\x00\x00"
                                  "ab")),
                "archive/data.pkl in model.pt");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_STREQ(e.what(),
                 "archive/data.pkl in model.pt: BINUNICODE at offset 2: expected 5 bytes of UTF-8 text, 2 left");
  }
  expect_format_error("", {"without a STOP"});
  expect_format_error(bytes_of("\x80\x02."), {"STOP", "stack underflow"});
  expect_format_error(bytes_of("\x80\x02"
                               "e."),
                      {"APPENDS", "MARK"});
  expect_format_error(bytes_of("\x80\x02(."), {"STOP", "after the last MARK"});
}

TEST(Reader, TrailingBytes) {
  EXPECT_TRUE(read("N.garbage")->is_none());
  ReadOptions strict;
  strict.allow_trailing_bytes = false;
  expect_format_error("N.garbage", {"7 bytes after STOP"}, strict);
}

TEST(Reader, LyingLengthsFailWithoutAllocating) {
  expect_format_error(bytes_of("\x80\x02X\x00\x00\x00\x80."), {"BINUNICODE", "expected 2147483648 bytes"});
  expect_format_error(bytes_of("\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\x7f."), {"BINBYTES8"});
  expect_format_error(bytes_of("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff."), {"BINUNICODE8"});
  expect_format_error(bytes_of("\x80\x05\x96\x00\x00\x00\x00\x00\x00\x00\x80."), {"BYTEARRAY8"});
  expect_format_error(bytes_of("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff."), {"FRAME"});
  expect_format_error(bytes_of("T\xff\xff\xff\xff."), {"BINSTRING", "negative"});
  // A huge memo index costs one map entry, not a 4 GiB table.
  EXPECT_EQ(read(bytes_of("\x80\x02K\x01r\xfe\xff\xff\xff"
                          "0j\xfe\xff\xff\xff."))
                ->as_int(),
            1);
}

TEST(Reader, DeepNestingIsRefused) {
  std::string deep = "\x80\x02";
  for (int i = 0; i < 3000; ++i) deep += "]";
  for (int i = 0; i < 2999; ++i) deep += "a";
  deep += ".";
  expect_format_error(deep, {"nesting depth 3000 exceeds the limit of 2000"});
  ReadOptions generous;
  generous.max_depth = 3000;
  EXPECT_TRUE(read(deep, generous)->is(Kind::kList));
  // 200000 levels: refused without recursion (no stack overflow).
  std::string huge = "\x80\x02)" + std::string(200000, '\x85') + ".";
  expect_format_error(huge, {"nesting depth"});
}

TEST(Reader, SharedNodesCountOnceTowardsDepth) {
  // x = a list nested 5 deep, then (x, x) through the memo: depth 6.
  std::string pair = "\x80\x02" + std::string(5, ']') + std::string(4, 'a') + std::string("q\x00h\x00\x86.", 6);
  ReadOptions five;
  five.max_depth = 5;
  expect_format_error(pair, {"nesting depth 6 exceeds the limit of 5"}, five);
  ReadOptions six;
  six.max_depth = 6;
  EXPECT_TRUE(read(pair, six)->is(Kind::kTuple));
  // 60 levels of (previous, previous): 2^60 paths, each shared node is walked once.
  std::string doubling = "\x80\x02)";
  for (int i = 0; i < 60; ++i) doubling += std::string("q\x00h\x00\x86", 5);
  doubling += ".";
  auto v = read(doubling);
  ASSERT_TRUE(v->is(Kind::kTuple));
  EXPECT_EQ(v->items()[0].get(), v->items()[1].get());
  ReadOptions sixty;
  sixty.max_depth = 60;
  expect_format_error(doubling, {"nesting depth 61 exceeds the limit of 60"}, sixty);
}

TEST(Reader, CycleMadeThroughDupOwnsItsCycle) {
  auto v = read(bytes_of("\x80\x02]2a."));  // EMPTY_LIST DUP APPEND: a list that holds itself
  ASSERT_TRUE(v->is(Kind::kList));
  ASSERT_EQ(v->items().size(), 1u);
  EXPECT_EQ(v->items()[0].get(), v.get());
  std::weak_ptr<Value> inner = v->items()[0];
  v.reset();
  EXPECT_TRUE(inner.expired());
}

TEST(Reader, SelfContainingListOwnsItsCycle) {
  auto v = read(bytes_of("\x80\x02]q\x00h\x00"
                         "a."));
  ASSERT_TRUE(v->is(Kind::kList));
  ASSERT_EQ(v->items().size(), 1u);
  EXPECT_EQ(v->items()[0].get(), v.get());
  std::weak_ptr<Value> inner = v->items()[0];
  v.reset();  // LeakSanitizer checks that the cycle was freed
  EXPECT_TRUE(inner.expired());
}

TEST(Reader, CycleThroughDictAndObject) {
  // d = {}; o = mod.C(); o.state = d; d['o'] = o
  auto v = read(bytes_of("\x80\x02}q\x00X\x01\x00\x00\x00o"
                         "cmod\nC\n)\x81h\x00"
                         "bs."));
  ASSERT_TRUE(v->is(Kind::kDict));
  auto o = v->get("o");
  ASSERT_TRUE(o && o->is(Kind::kObject));
  EXPECT_EQ(o->state().get(), v.get());
  std::weak_ptr<Value> weak = o;
  o.reset();
  v.reset();
  EXPECT_TRUE(weak.expired());
}

TEST(Reader, DroppedAndRejectedCyclesAreFreed) {
  // A cyclic list that is popped: the result is None and the cycle must not leak.
  EXPECT_TRUE(read(bytes_of("\x80\x02]q\x00h\x00"
                            "a0N."))
                  ->is_none());
  // A cyclic list in a pickle that is cut short.
  expect_format_error(bytes_of("\x80\x02]q\x00h\x00"
                               "a"),
                      {"without a STOP"});
}

// Every prefix of a valid pickle is rejected cleanly.
TEST(Reader, EveryTruncationIsFormatError) {
  for (const std::string& full : {kDictP2, kDictP0}) {
    for (std::size_t n = 0; n < full.size(); ++n) {
      EXPECT_THROW(read(std::string_view(full).substr(0, n)), FormatError) << "length " << n;
    }
  }
}

// Flipped bytes give a value or a FormatError, never a crash (sanitizers watch).
TEST(Reader, FlippedBytesNeverCrash) {
  for (const std::string& full : {kDictP2, kDictP0}) {
    for (std::size_t i = 0; i < full.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string mutated = full;
        mutated[i] = static_cast<char>(mutated[i] ^ (1 << bit));
        try {
          auto v = read(mutated);
          EXPECT_TRUE(v != nullptr);
        } catch (const FormatError&) {
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardpoint::pickle
