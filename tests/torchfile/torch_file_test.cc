#include "torchfile/torch_file.h"

#include <gtest/gtest.h>

#include <cstring>

#include "pickle/writer.h"
#include "test_util.h"
#include "torch_test_util.h"
#include "torchfile/torch_save_writer.h"
#include "torchfile/zip_writer.h"

namespace shardpoint::torchfile {
namespace {

using pickle::Value;
using pickle::ValuePtr;
using Runs = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

Runs runs_of(const TensorInfo& t) {
  Runs r;
  for_each_run(t, [&](std::uint64_t o, std::uint64_t n) { r.emplace_back(o, n); });
  return r;
}

TensorInfo fake(DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides, std::int64_t offset) {
  TensorInfo t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.strides = std::move(strides);
  t.storage_offset = offset;
  t.storage = {64, 1 << 20};
  return t;
}

TEST(ForEachRun, ContiguousIsOneRun) {
  EXPECT_EQ(runs_of(fake(DType::kFloat32, {2, 3}, {3, 1}, 0)), (Runs{{64, 24}}));
  EXPECT_EQ(runs_of(fake(DType::kFloat32, {2, 6}, {6, 1}, 6)), (Runs{{64 + 24, 48}}));
  EXPECT_EQ(runs_of(fake(DType::kFloat64, {}, {}, 3)), (Runs{{64 + 24, 8}}));
  EXPECT_EQ(runs_of(fake(DType::kInt8, {1, 5, 1}, {99, 1, 42}, 0)), (Runs{{64, 5}}));
  EXPECT_TRUE(runs_of(fake(DType::kFloat32, {0, 3}, {3, 1}, 0)).empty());
  EXPECT_TRUE(runs_of(fake(DType::kFloat32, {3, 0}, {0, 1}, 0)).empty());
}

TEST(ForEachRun, StridedViews) {
  // base = arange(24).reshape(4, 6) float32; transposed (6,4) strides (1,6)
  Runs t = runs_of(fake(DType::kFloat32, {3, 2}, {1, 3}, 0));
  EXPECT_EQ(t, (Runs{{64, 4}, {76, 4}, {68, 4}, {80, 4}, {72, 4}, {84, 4}}));
  // base[:, 1::2]: rows of 3 elements 2 apart
  Runs s = runs_of(fake(DType::kFloat32, {4, 3}, {6, 2}, 1));
  ASSERT_EQ(s.size(), 12u);
  EXPECT_EQ(s[0], (std::pair<std::uint64_t, std::uint64_t>{68, 4}));
  EXPECT_EQ(s[1], (std::pair<std::uint64_t, std::uint64_t>{76, 4}));
  EXPECT_EQ(s[3], (std::pair<std::uint64_t, std::uint64_t>{68 + 24, 4}));
  // rows of a wider matrix: runs of whole rows
  EXPECT_EQ(runs_of(fake(DType::kInt16, {3, 2}, {5, 1}, 1)), (Runs{{66, 4}, {76, 4}, {86, 4}}));
  // expanded (stride 0): the same row again
  EXPECT_EQ(runs_of(fake(DType::kInt16, {3, 3}, {0, 1}, 0)), (Runs{{64, 6}, {64, 6}, {64, 6}}));
  // consecutive rows that touch merge: (2, 3) with row stride 3 but an outer size-1 dim
  EXPECT_EQ(runs_of(fake(DType::kUInt8, {2, 1, 3}, {3, 100, 1}, 0)), (Runs{{64, 6}}));
}

struct Built {
  std::string bytes;
  std::vector<test::TensorSpec> specs;
};

// {dtype name: tensor} for every dtype, plus a parameter, a shared transposed view and
// the same tensor twice (memo sharing).
Built build_all_dtypes(const TorchSaveOptions& options = {}) {
  Built b;
  pickle::DictEntries entries;
  int key = 0;
  std::vector<std::pair<std::string, std::string>> storages;
  for (DType d : kAllDTypes) {
    std::vector<std::int64_t> shape{2, 3};
    if (key % 3 == 1) shape = {};
    if (key % 5 == 2) shape = {4};
    std::size_t n = static_cast<std::size_t>(test::numel_of(shape)) * dtype_itemsize(d);
    std::string data = test::pattern_bytes(n, key);
    if (d == DType::kBool)
      for (char& c : data) c = static_cast<char>(c & 1);
    auto strides = contiguous_strides(shape);
    ValuePtr node = make_tensor_node(d, shape, strides, 0, std::to_string(key), test::numel_of(shape));
    entries.emplace_back(Value::str(std::string(dtype_name(d))), node);
    storages.emplace_back(std::to_string(key), data);
    b.specs.push_back({d, shape, data});
    ++key;
  }
  // shared storage: base (2,3) float32 in storage "s", its transpose, and a row slice
  std::string base = test::pattern_bytes(24, 99);
  std::vector<std::int64_t> s23{2, 3}, s32{3, 2}, s3{3};
  std::vector<std::int64_t> st23{3, 1}, st32{1, 3}, st3{1};
  entries.emplace_back(Value::str("base"), make_tensor_node(DType::kFloat32, s23, st23, 0, "s", 6));
  entries.emplace_back(Value::str("base_t"), make_tensor_node(DType::kFloat32, s32, st32, 0, "s", 6));
  entries.emplace_back(Value::str("row1"), make_tensor_node(DType::kFloat32, s3, st3, 3, "s", 6));
  storages.emplace_back("s", base);
  ValuePtr param = make_parameter_node(make_tensor_node(DType::kFloat32, s3, st3, 0, "p", 3, "cuda:1", false), true);
  entries.emplace_back(Value::str("param"), param);
  entries.emplace_back(Value::str("param_again"), param);
  storages.emplace_back("p", test::pattern_bytes(12, 7));
  ValuePtr root = Value::dict(std::move(entries));
  StringSink sink;
  TorchSaveWriter w(sink, options);
  w.write_pickle(*root);
  for (const auto& [k, data] : storages) {
    if (k == "s") {  // streamed in pieces
      w.begin_storage(k, data.size());
      w.write(as_bytes(std::string_view(data).substr(0, 5)));
      w.write(as_bytes(std::string_view(data).substr(5)));
      w.end_storage();
    } else {
      w.write_storage(k, as_bytes(data));
    }
  }
  w.finish();
  b.bytes = sink.take();
  return b;
}

std::string read_all(const TorchFile& f, const TensorInfo& t) {
  std::string out(t.nbytes(), '\0');
  f.read_tensor(t, std::as_writable_bytes(std::span(out)));
  return out;
}

void check_all_dtypes(const TorchFile& f, const Built& b) {
  EXPECT_EQ(f.archive_name(), "archive");
  EXPECT_EQ(f.version(), 3);
  EXPECT_FALSE(f.big_endian());
  test::TreeWalk walk;
  test::walk_tree(f, *f.root(), "", walk);
  ASSERT_EQ(walk.tensors.size(), b.specs.size() + 5);
  for (std::size_t i = 0; i < b.specs.size(); ++i) {
    const auto& spec = b.specs[i];
    std::string path = "/" + std::string(dtype_name(spec.dtype));
    SCOPED_TRACE(path);
    ASSERT_TRUE(walk.tensors.count(path));
    const TensorInfo& t = *walk.tensors[path];
    EXPECT_EQ(t.dtype, spec.dtype);
    EXPECT_EQ(t.shape, spec.shape);
    EXPECT_EQ(t.strides, contiguous_strides(spec.shape));
    EXPECT_EQ(t.storage_key, std::to_string(i));
    EXPECT_EQ(t.location, "cpu");
    EXPECT_FALSE(t.is_parameter);
    EXPECT_EQ(t.storage.size, spec.data.size());
    EXPECT_EQ(t.storage.offset % 64, 0u);
    EXPECT_EQ(t.storage_numel, static_cast<std::uint64_t>(test::numel_of(spec.shape)));
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(read_all(f, t), spec.data);
    EXPECT_EQ(test::tensor_sha256(f, t), test::sha256_of(spec.data));
    if (auto v = f.storage_view(t)) {
      EXPECT_EQ(as_chars(*v), spec.data);
    }
  }
  const TensorInfo& base = *walk.tensors["/base"];
  const TensorInfo& bt = *walk.tensors["/base_t"];
  const TensorInfo& row = *walk.tensors["/row1"];
  EXPECT_EQ(base.storage, bt.storage);
  EXPECT_EQ(base.storage_key, "s");
  EXPECT_EQ(bt.storage_key, "s");
  EXPECT_FALSE(bt.is_contiguous());
  std::string sb = read_all(f, base);
  std::string st = read_all(f, bt);
  std::string sr = read_all(f, row);
  // transpose: element (i, j) of base_t == element (j, i) of base
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) EXPECT_EQ(st.substr((i * 2 + j) * 4, 4), sb.substr((j * 3 + i) * 4, 4));
  }
  EXPECT_EQ(sr, sb.substr(12, 12));
  const TensorInfo& p = *walk.tensors["/param"];
  EXPECT_TRUE(p.is_parameter);
  EXPECT_TRUE(p.requires_grad);
  EXPECT_EQ(p.location, "cuda:1");
  EXPECT_EQ(walk.tensors["/param_again"], &p);
  EXPECT_EQ(f.storages().size(), b.specs.size() + 2);
}

TEST(TorchFile, WriterRoundTripAllDTypesInMemory) {
  Built b = build_all_dtypes();
  auto f = TorchFile::open(std::make_unique<MemorySource>(as_bytes(b.bytes), "mem.pt"));
  check_all_dtypes(*f, b);
  // records in PyTorch >= 2.1 order
  std::vector<std::string> names;
  for (const auto& e : f->archive().entries()) names.push_back(e.name);
  ASSERT_GE(names.size(), 5u);
  EXPECT_EQ(names[0], "archive/data.pkl");
  EXPECT_EQ(names[1], "archive/byteorder");
  EXPECT_EQ(names[2], "archive/data/0");
  EXPECT_EQ(names[names.size() - 2], "archive/version");
  EXPECT_EQ(names.back(), "archive/.data/serialization_id");
  std::string id = f->archive().read(f->archive().entries().back());
  EXPECT_EQ(id.size(), 40u);
  EXPECT_EQ(id.find_first_not_of("0123456789"), std::string::npos);
}

TEST(TorchFile, WriterRoundTripMappedFileForcedZip64AndFileSource) {
  Built b = build_all_dtypes({.archive_name = "my_model", .zip = {.force_zip64 = true}});
  testing::TempDir dir;
  std::string path = dir.file("m.pt");
  testing::write_text(path, b.bytes);
  auto f = TorchFile::open(path);
  EXPECT_EQ(f->archive_name(), "my_model");
  f->archive_name();
  // archive_name differs; check_all_dtypes expects "archive"
  auto g = TorchFile::open(FileSource::open(path));
  EXPECT_FALSE(g->storage_view(g->tensors()[0]).has_value());
  for (const TorchFile* x : {f.get(), g.get()}) {
    test::TreeWalk walk;
    test::walk_tree(*x, *x->root(), "", walk);
    EXPECT_EQ(walk.tensors.size(), b.specs.size() + 5);
    for (const auto& spec : b.specs) {
      const TensorInfo& t = *walk.tensors["/" + std::string(dtype_name(spec.dtype))];
      EXPECT_EQ(read_all(*x, t), spec.data);
    }
  }
}

TEST(TorchFile, BlobInsideALargerFile) {
  Built b = build_all_dtypes();
  std::string file = "prefix-bytes" + b.bytes + "more";
  MemorySource whole(as_bytes(file), "__0_0.distcp");
  auto blob = std::make_unique<MemorySource>(as_bytes(file).subspan(12, b.bytes.size()), "__0_0.distcp[12]");
  auto f = TorchFile::open(std::move(blob));
  check_all_dtypes(*f, b);
}

// A hand-made archive: data.pkl of `root`, given extra records, in order.
std::string make_archive(const pickle::Value& root, const std::vector<std::pair<std::string, std::string>>& records,
                         bool with_pickle = true) {
  StringSink sink;
  ZipWriter w(sink);
  if (with_pickle) w.write_record("archive/data.pkl", pickle::pickle_to_string(root));
  for (const auto& [n, d] : records) w.write_record(n, d);
  w.finish();
  return sink.take();
}

std::string open_error(const std::string& bytes) {
  try {
    auto f = TorchFile::open(std::make_unique<MemorySource>(as_bytes(bytes), "x.pt"));
    for (const TensorInfo& t : f->tensors()) {
      EXPECT_LE(t.storage.offset + t.storage.size, bytes.size());
      if (t.nbytes() <= (1u << 20)) read_all(*f, t);
    }
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TEST(TorchFile, BigEndianFilesAreSwappedOnRead) {
  std::vector<std::int64_t> shape{3}, strides{1};
  ValuePtr root = Value::dict({
      {Value::str("f"), make_tensor_node(DType::kFloat32, shape, strides, 0, "0", 3)},
      {Value::str("c"),
       make_tensor_node(DType::kComplex64, std::vector<std::int64_t>{1}, std::vector<std::int64_t>{1}, 0, "1", 1)},
  });
  std::string be("\x3f\x80\x00\x00\x40\x00\x00\x00\xc0\x40\x00\x00", 12);  // 1, 2, -3 big-endian
  std::string bc("\x3f\x80\x00\x00\x40\x00\x00\x00", 8);                   // 1+2j
  std::string z = make_archive(
      *root,
      {{"archive/byteorder", "big"}, {"archive/data/0", be}, {"archive/data/1", bc}, {"archive/version", "3\n"}});
  auto f = TorchFile::open(std::make_unique<MemorySource>(as_bytes(z), "be.pt"));
  EXPECT_TRUE(f->big_endian());
  const TensorInfo& t = f->tensors()[0];
  EXPECT_TRUE(t.big_endian);
  std::string got = read_all(*f, t);
  float v[3];
  std::memcpy(v, got.data(), 12);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 2.0f);
  EXPECT_EQ(v[2], -3.0f);
  std::string gc = read_all(*f, f->tensors()[1]);
  std::memcpy(v, gc.data(), 8);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 2.0f);
}

TEST(TorchFile, MalformedFilesAreFormatErrorsNamingTheProblem) {
  std::vector<std::int64_t> shape{2, 2}, strides{2, 1};
  ValuePtr ok = make_tensor_node(DType::kFloat32, shape, strides, 0, "0", 4);
  const std::string data(16, '\1');
  auto has = [](const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; };
  EXPECT_EQ(open_error(make_archive(*ok, {{"archive/data/0", data}, {"archive/version", "3\n"}})), "");
  // legacy
  std::string legacy("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.rest", 19);
  EXPECT_EQ(open_error(legacy),
            "x.pt is a legacy (pre-1.6) torch.save file; not supported: re-save it with a current PyTorch");
  EXPECT_TRUE(has(open_error("PYTORCH1xxxxxxxxxxx"), "PYTORCH1"));
  EXPECT_TRUE(has(open_error("hello world, not a zip"), "expected zip local header PK\\3\\4 at offset 0"));
  EXPECT_TRUE(has(open_error(make_archive(*ok, {{"archive/data/0", data}})), "no \"archive/version\" record"));
  EXPECT_EQ(open_error(make_archive(*ok, {{"archive/data/0", data}, {"archive/.data/version", "3\n"}})), "");
  EXPECT_TRUE(has(open_error(make_archive(*ok, {{"archive/data/0", data}, {"archive/version", "x\n"}})),
                  "expected a format version"));
  EXPECT_TRUE(has(open_error(make_archive(
                      *ok, {{"archive/data/0", data}, {"archive/version", "3"}, {"archive/byteorder", "middle"}})),
                  "expected \"little\" or \"big\""));
  EXPECT_TRUE(has(open_error(make_archive(*ok, {{"archive/version", "3"}})), "record \"archive/data/0\" is missing"));
  EXPECT_TRUE(has(open_error(make_archive(*ok, {{"archive/data/0", data.substr(1)}, {"archive/version", "3"}})),
                  "expected 16 bytes"));
  EXPECT_TRUE(has(open_error(make_archive(*ok, {{"other/data/0", data}, {"archive/version", "3"}})), "is not under"));
  EXPECT_TRUE(has(open_error(make_archive(*ok, {{"archive/version", "3"}}, false)), "no \"archive/data.pkl\""));
  // view outside its storage
  std::vector<std::int64_t> big{3, 2};
  ValuePtr oob = make_tensor_node(DType::kFloat32, big, strides, 0, "0", 4);
  EXPECT_TRUE(has(open_error(make_archive(*oob, {{"archive/data/0", data}, {"archive/version", "3"}})),
                  "reaches element 6 of a storage of 4 float32 elements"));
  ValuePtr off = make_tensor_node(DType::kFloat32, shape, strides, 1, "0", 4);
  EXPECT_TRUE(
      has(open_error(make_archive(*off, {{"archive/data/0", data}, {"archive/version", "3"}})), "reaches element 5"));
  // huge strides: overflow-safe
  std::vector<std::int64_t> huge_strides{INT64_MAX, INT64_MAX};
  ValuePtr hs = make_tensor_node(DType::kFloat32, shape, huge_strides, 0, "0", 4);
  EXPECT_TRUE(
      has(open_error(make_archive(*hs, {{"archive/data/0", data}, {"archive/version", "3"}})), "reaches element"));
  // negative stride (hand-built)
  ValuePtr neg =
      Value::call("torch._utils", "_rebuild_tensor_v2",
                  {Value::persistent_id(Value::tuple({Value::str("storage"), Value::global("torch", "FloatStorage"),
                                                      Value::str("0"), Value::str("cpu"), Value::integer(4)})),
                   Value::integer(0), Value::tuple({Value::integer(2)}), Value::tuple({Value::integer(-1)}),
                   Value::boolean(false), Value::call("collections", "OrderedDict", {})});
  EXPECT_TRUE(has(open_error(make_archive(*neg, {{"archive/data/0", data}, {"archive/version", "3"}})),
                  "non-negative ints in stride"));
  // unknown storage type
  ValuePtr q =
      Value::call("torch._utils", "_rebuild_tensor_v2",
                  {Value::persistent_id(Value::tuple({Value::str("storage"), Value::global("torch", "QInt8Storage"),
                                                      Value::str("0"), Value::str("cpu"), Value::integer(4)})),
                   Value::integer(0), Value::tuple({Value::integer(2)}), Value::tuple({Value::integer(1)}),
                   Value::boolean(false), Value::call("collections", "OrderedDict", {})});
  EXPECT_TRUE(has(open_error(make_archive(*q, {{"archive/data/0", data}, {"archive/version", "3"}})),
                  "unsupported storage type torch.QInt8Storage"));
  // wrong argument kinds
  ValuePtr bad = Value::call("torch._utils", "_rebuild_tensor_v2", {Value::integer(1)});
  EXPECT_TRUE(has(open_error(make_archive(*bad, {{"archive/version", "3"}})), "argument 0 (storage)"));
}

TEST(TorchFile, TruncatedAndFlippedFilesNeverCrash) {
  std::vector<std::int64_t> shape{2, 3};
  ValuePtr root = Value::dict({
      {Value::str("a"), make_tensor_node(DType::kFloat32, shape, contiguous_strides(shape), 0, "0", 6)},
      {Value::str("b"),
       make_parameter_node(make_tensor_node(DType::kUInt16, shape, contiguous_strides(shape), 0, "1", 6))},
      {Value::str("c"), Value::list({Value::integer(1), Value::str("x")})},
  });
  StringSink sink;
  TorchSaveWriter w(sink);
  w.write_pickle(*root);
  w.write_storage("0", as_bytes(std::string(24, 'a')));
  w.write_storage("1", as_bytes(std::string(12, 'b')));
  w.finish();
  const std::string z = sink.take();
  ASSERT_EQ(open_error(z), "");
  for (std::size_t n = 0; n < z.size(); ++n) EXPECT_NE(open_error(z.substr(0, n)), "") << n;
  int errors = 0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    for (unsigned char x : {0x01, 0x10, 0xff}) {
      std::string c = z;
      c[i] = static_cast<char>(c[i] ^ x);
      if (!open_error(c).empty()) ++errors;
    }
  }
  EXPECT_GT(errors, 200);
}

}  // namespace
}  // namespace shardpoint::torchfile
