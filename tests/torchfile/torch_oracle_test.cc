// Interop with real PyTorch: files torch.save wrote are read (Debian's PyTorch 1.13, and
// the PyTorch 2.6 root when present), and files the writer wrote are loaded by torch.load.
// The oracle is tests/torchfile/oracle_torch.py.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "shardpoint/pickle_value.h"
#include "test_util.h"
#include "torch_test_util.h"
#include "torchfile/torch_file.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::torchfile {
namespace {

using nlohmann::json;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

const std::string kOracle = std::string(SP_SOURCE_DIR) + "/tests/torchfile/oracle_torch.py";

std::string to_hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

// The PyTorch 2.6 runner (scripts/oracle-python), or "" when that root is not usable.
std::string torch26_runner() {
  std::string runner = std::string(SP_SOURCE_DIR) + "/scripts/oracle-python";
  auto r = testing::run_command(
      runner + " -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith(\"2.6\") else 1)' 2>/dev/null");
  return r.exit_code == 0 ? runner : "";
}

#define SP_REQUIRE_TORCH26_RUNNER(var)                                                                     \
  std::string var = torch26_runner();                                                                      \
  if (var.empty()) {                                                                                       \
    if (testing::oracles_required()) FAIL() << "oracle missing: PyTorch 2.6 root (scripts/oracle-python)"; \
    GTEST_SKIP() << "oracle missing: PyTorch 2.6 root; run make oracle";                                   \
  }

// Checks every file of a manifest made by `oracle_torch.py make`.
void check_manifest(const std::string& dir) {
  json manifest = json::parse(testing::read_text(dir + "/manifest.json"));
  ASSERT_GE(manifest.size(), 7u);
  int tensors_checked = 0, scalars_checked = 0;
  for (const auto& [file, want] : manifest.items()) {
    SCOPED_TRACE(file);
    auto f = TorchFile::open(dir + "/" + file);
    std::string stem = file.substr(0, file.find('.'));
    EXPECT_EQ(f->archive_name(), file == "stream.pt" ? "archive" : stem);
    test::TreeWalk walk;
    test::walk_tree(*f, *f->root(), "", walk);
    EXPECT_EQ(walk.tensors.size(), want["tensors"].size());
    std::map<std::string, std::string> key_of_tag;
    for (const auto& [path, wt] : want["tensors"].items()) {
      SCOPED_TRACE(path);
      ASSERT_TRUE(walk.tensors.count(path));
      const TensorInfo& t = *walk.tensors[path];
      EXPECT_EQ(dtype_name(t.dtype), wt["dtype"].get<std::string>());
      EXPECT_EQ(t.shape, wt["shape"].get<std::vector<std::int64_t>>());
      EXPECT_EQ(t.strides, wt["strides"].get<std::vector<std::int64_t>>());
      EXPECT_EQ(t.storage_offset, wt["storage_offset"].get<std::int64_t>());
      EXPECT_EQ(t.requires_grad, wt["requires_grad"].get<bool>());
      EXPECT_EQ(t.is_parameter, wt["is_parameter"].get<bool>());
      EXPECT_EQ(t.location, "cpu");
      EXPECT_EQ(t.storage.offset % 64, 0u);
      EXPECT_EQ(test::tensor_sha256(*f, t), wt["sha256"].get<std::string>());
      std::string row(t.nbytes(), '\0');
      f->read_tensor(t, std::as_writable_bytes(std::span(row)));
      EXPECT_EQ(test::sha256_of(row), wt["sha256"].get<std::string>());
      if (!wt["storage"].is_null()) {
        auto [it, fresh] = key_of_tag.emplace(wt["storage"].get<std::string>(), t.storage_key);
        EXPECT_EQ(it->second, t.storage_key) << "tensors sharing a storage share a key";
      }
      ++tensors_checked;
    }
    std::set<std::string> keys;
    for (const auto& [tag, key] : key_of_tag) keys.insert(key);
    EXPECT_EQ(keys.size(), key_of_tag.size()) << "distinct storages have distinct keys";
    for (const auto& [path, ws] : want["scalars"].items()) {
      SCOPED_TRACE(path);
      std::string kind = ws["kind"];
      if (kind == "other") continue;
      ASSERT_TRUE(walk.scalars.count(path));
      const Value& v = *walk.scalars[path];
      if (kind == "none") {
        EXPECT_TRUE(v.is_none());
      } else if (kind == "bool") {
        EXPECT_EQ(v.as_bool(), ws["value"].get<bool>());
      } else if (kind == "int") {
        EXPECT_EQ(to_hex(v.int_le_bytes()), ws["le"].get<std::string>());
      } else if (kind == "str") {
        EXPECT_EQ(to_hex(v.as_string()), ws["utf8"].get<std::string>());
      } else if (kind == "float") {
        double want_v = std::strtod(ws["value"].get<std::string>().c_str(), nullptr);
        double got = v.as_float();
        if (std::isnan(want_v)) {
          EXPECT_TRUE(std::isnan(got));
        } else {
          EXPECT_EQ(std::memcmp(&got, &want_v, sizeof got), 0) << got << " vs " << want_v;
        }
      }
      ++scalars_checked;
    }
  }
  EXPECT_GT(tensors_checked, 30);
  EXPECT_GT(scalars_checked, 20);
  try {
    TorchFile::open(dir + "/legacy.pt");
    ADD_FAILURE() << "legacy file opened";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("is a legacy (pre-1.6) torch.save file; not supported"), std::string::npos)
        << e.what();
  }
}

TEST(TorchOracle, ReadsWhatTorch113Saves) {
  SP_REQUIRE_TORCH113(python);
  testing::TempDir dir;
  auto r = testing::run_command(python + " " + kOracle + " make " + dir.path().string() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  check_manifest(dir.path().string());
}

// Copies a file through the reader and the writer: same tree, storages copied by key in
// the order the source file has them.
void copy_through(const std::string& from, const std::string& to, bool keep_archive_name = false) {
  auto f = TorchFile::open(from);
  UniqueFd fd = UniqueFd::open(to, O_WRONLY | O_CREAT | O_TRUNC);
  FileSink sink(fd, 0, 4096);
  TorchSaveOptions options;
  if (keep_archive_name) options.archive_name = f->archive_name();
  TorchSaveWriter w(sink, options);
  w.write_pickle(*f->root());
  const std::string data_prefix = f->archive_name() + "/data/";
  std::vector<std::pair<std::string, ByteRange>> storages;
  for (const ZipEntry& e : f->archive().entries()) {
    if (e.name.compare(0, data_prefix.size(), data_prefix) != 0) continue;
    std::string key = e.name.substr(data_prefix.size());
    if (f->storages().count(key)) storages.emplace_back(key, f->storages().at(key));
  }
  ASSERT_EQ(storages.size(), f->storages().size());
  for (const auto& [key, range] : storages) {
    w.begin_storage(key, range.size);
    auto view = f->source().view(range.offset, range.size, "storage");
    ASSERT_TRUE(view.has_value());
    w.write(*view);
    w.end_storage();
  }
  w.finish();
  sink.flush();
}

TEST(TorchOracle, Torch113LoadsReadThenRewrittenFilesIncludingUnknownObjects) {
  SP_REQUIRE_TORCH113(python);
  testing::TempDir dir;
  auto r = testing::run_command(python + " " + kOracle + " make " + dir.path().string() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"exotic.pt", "nested.pt", "views.pt", "dtypes.pt", "edge.pt", "tensor_root.pt"}) {
    SCOPED_TRACE(name);
    std::string from = dir.file(name), to = dir.file(std::string("copy_") + name);
    copy_through(from, to);
    auto s = testing::run_command(python + " " + kOracle + " same " + from + " " + to + " 2>&1");
    EXPECT_EQ(s.exit_code, 0) << s.output;
  }
}

// What the C++ writer produces for the load checks: tensors (contiguous and views, shared
// storages, parameters) of every dtype 1.13 knows, in nested containers.
struct WriterCase {
  ValuePtr root;
  std::vector<std::pair<std::string, std::string>> storages;
  json expected;
};

json tensor_json(DType d, const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
                 std::int64_t offset, bool requires_grad, bool param, const std::string& row_major) {
  return {{"dtype", std::string(dtype_name(d))},
          {"shape", shape},
          {"strides", strides},
          {"storage_offset", offset},
          {"requires_grad", requires_grad},
          {"is_parameter", param},
          {"sha256", test::sha256_of(row_major)}};
}

WriterCase make_writer_case(const std::vector<DType>& dtypes, bool floats = true) {
  WriterCase c;
  c.expected = {{"tensors", json::object()}, {"scalars", json::object()}};
  pickle::DictEntries by_dtype;
  int key = 0;
  for (DType d : dtypes) {
    std::vector<std::int64_t> shape = key % 4 == 3 ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{2, 3};
    std::string data = test::pattern_bytes(static_cast<std::size_t>(test::numel_of(shape)) * dtype_itemsize(d), key);
    if (d == DType::kBool)
      for (char& ch : data) ch = static_cast<char>(ch & 1);
    if (d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 || d == DType::kBFloat16 ||
        d == DType::kComplex64 || d == DType::kComplex128) {
      // keep floats finite: clear the top exponent bit of every element's high byte
      std::size_t w = dtype_itemsize(d);
      if (d == DType::kComplex64 || d == DType::kComplex128) w /= 2;
      for (std::size_t i = w - 1; i < data.size(); i += w) data[i] = static_cast<char>(data[i] & 0xbf);
    }
    auto strides = contiguous_strides(shape);
    by_dtype.emplace_back(Value::str(std::string(dtype_name(d))),
                          make_tensor_node(d, shape, strides, 0, std::to_string(key), test::numel_of(shape)));
    c.expected["tensors"]["/dtypes/" + std::string(dtype_name(d))] =
        tensor_json(d, shape, strides, 0, false, false, data);
    c.storages.emplace_back(std::to_string(key), data);
    ++key;
  }
  // shared storage "v": 4x6 int32 base, its transpose, a slice with offset, a column
  std::string base(96, '\0');
  for (int i = 0; i < 24; ++i) std::memcpy(&base[i * 4], &i, 4);
  auto ints = [&](std::initializer_list<int> idx) {
    std::string s;
    for (int i : idx) s += base.substr(i * 4, 4);
    return s;
  };
  std::vector<std::int64_t> sh46{4, 6}, st46{6, 1}, sh64{6, 4}, st64{1, 6}, sh26{2, 6}, sh4{4}, st4{6};
  ValuePtr vbase = make_tensor_node(DType::kInt32, sh46, st46, 0, "v", 24);
  ValuePtr vt = make_tensor_node(DType::kInt32, sh64, st64, 0, "v", 24);
  ValuePtr vslice = make_tensor_node(DType::kInt32, sh26, st46, 6, "v", 24);
  ValuePtr vcol = make_tensor_node(DType::kInt32, sh4, st4, 2, "v", 24);
  c.storages.emplace_back("v", base);
  c.expected["tensors"]["/views/base"] = tensor_json(DType::kInt32, sh46, st46, 0, false, false, base);
  std::string tbytes;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) tbytes += ints({j * 6 + i});
  c.expected["tensors"]["/views/t"] = tensor_json(DType::kInt32, sh64, st64, 0, false, false, tbytes);
  c.expected["tensors"]["/views/slice"] = tensor_json(DType::kInt32, sh26, st46, 6, false, false, base.substr(24, 48));
  c.expected["tensors"]["/views/col"] = tensor_json(DType::kInt32, sh4, st4, 2, false, false, ints({2, 8, 14, 20}));
  // a parameter, in an OrderedDict
  std::string pdata = test::pattern_bytes(12, 77);
  for (std::size_t i = 3; i < 12; i += 4) pdata[i] = static_cast<char>(pdata[i] & 0xbf);
  std::vector<std::int64_t> sh3{3}, st1{1};
  ValuePtr param = make_parameter_node(make_tensor_node(DType::kFloat32, sh3, st1, 0, "p", 3), true);
  c.storages.emplace_back("p", pdata);
  c.expected["tensors"]["/model/weight"] = tensor_json(DType::kFloat32, sh3, st1, 0, true, true, pdata);
  ValuePtr od = Value::call("collections", "OrderedDict", {});
  od->mutable_entries().emplace_back(Value::str("weight"), param);
  od->mutable_entries().emplace_back(Value::str("steps"), Value::integer(12));
  c.expected["scalars"]["/model/steps"] = {{"kind", "int"}, {"le", "0c"}};
  // empty tensor
  std::vector<std::int64_t> sh03{0, 3}, st03{3, 1};
  ValuePtr empty = make_tensor_node(DType::kFloat64, sh03, st03, 0, "e", 0);
  c.storages.emplace_back("e", "");
  c.expected["tensors"]["/empty"] = tensor_json(DType::kFloat64, sh03, st03, 0, false, false, "");
  // scalars
  std::string big_le("\x00\x00\x00\x00\x00\x00\x00\x00\x40", 9);  // 2**70
  // Python floats pickle as BINFLOAT, which 1.13's weights-only unpickler rejects.
  ValuePtr misc =
      Value::list({Value::big_integer(big_le), Value::integer(-1), floats ? Value::floating(1.5) : Value::integer(2),
                   floats ? Value::floating(-INFINITY) : Value::integer(-3), Value::str("h\xc3\xa9llo \xe2\x9c\x93"),
                   Value::none(), Value::boolean(true), Value::tuple({Value::integer(300), Value::str("")})});
  c.expected["scalars"]["/misc/0"] = {{"kind", "int"}, {"le", "000000000000000040"}};
  c.expected["scalars"]["/misc/1"] = {{"kind", "int"}, {"le", "ff"}};
  if (floats) {
    c.expected["scalars"]["/misc/2"] = {{"kind", "float"}, {"value", "1.5"}};
    c.expected["scalars"]["/misc/3"] = {{"kind", "float"}, {"value", "-inf"}};
  } else {
    c.expected["scalars"]["/misc/2"] = {{"kind", "int"}, {"le", "02"}};
    c.expected["scalars"]["/misc/3"] = {{"kind", "int"}, {"le", "fd"}};
  }
  c.expected["scalars"]["/misc/4"] = {{"kind", "str"}, {"utf8", to_hex("h\xc3\xa9llo \xe2\x9c\x93")}};
  c.expected["scalars"]["/misc/5"] = {{"kind", "none"}};
  c.expected["scalars"]["/misc/6"] = {{"kind", "bool"}, {"value", true}};
  c.expected["scalars"]["/misc/7/0"] = {{"kind", "int"}, {"le", "2c01"}};
  c.expected["scalars"]["/misc/7/1"] = {{"kind", "str"}, {"utf8", ""}};
  c.root = Value::dict({
      {Value::str("dtypes"), Value::dict(std::move(by_dtype))},
      {Value::str("views"), Value::dict({{Value::str("base"), vbase},
                                         {Value::str("t"), vt},
                                         {Value::str("slice"), vslice},
                                         {Value::str("col"), vcol}})},
      {Value::str("model"), od},
      {Value::str("empty"), empty},
      {Value::str("misc"), misc},
  });
  return c;
}

std::string write_case(const WriterCase& c, const testing::TempDir& dir, const std::string& name,
                       ZipWriterOptions zip = {}) {
  std::string path = dir.file(name + ".pt");
  UniqueFd fd = UniqueFd::open(path, O_WRONLY | O_CREAT | O_TRUNC);
  FileSink sink(fd);
  TorchSaveWriter w(sink, {.zip = zip});
  w.write_pickle(*c.root);
  for (const auto& [k, d] : c.storages) w.write_storage(k, as_bytes(d));
  w.finish();
  sink.flush();
  testing::write_text(dir.file(name + ".json"), c.expected.dump(1));
  return path;
}

const std::vector<DType> kTorch113DTypes = {DType::kFloat32,   DType::kFloat64,    DType::kFloat16, DType::kBFloat16,
                                            DType::kComplex64, DType::kComplex128, DType::kInt8,    DType::kInt16,
                                            DType::kInt32,     DType::kInt64,      DType::kUInt8,   DType::kBool};

TEST(TorchOracle, Torch113LoadsWriterOutputWeightsOnly) {
  SP_REQUIRE_TORCH113(python);
  testing::TempDir dir;
  for (int variant = 0; variant < 3; ++variant) {
    const bool force64 = variant == 1, floats = variant == 2;
    WriterCase c = make_writer_case(kTorch113DTypes, floats);
    std::string name = "w" + std::to_string(variant);
    std::string path = write_case(c, dir, name, {.force_zip64 = force64});
    auto r = testing::run_command(python + " " + kOracle + " check " + path + " " + dir.file(name + ".json") +
                                  (floats ? " --unsafe" : "") + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    // and our reader agrees with the same expectations
    auto f = TorchFile::open(path);
    test::TreeWalk walk;
    test::walk_tree(*f, *f->root(), "", walk);
    for (const auto& [p, wt] : c.expected["tensors"].items()) {
      ASSERT_TRUE(walk.tensors.count(p)) << p;
      EXPECT_EQ(test::tensor_sha256(*f, *walk.tensors[p]), wt["sha256"].get<std::string>()) << p;
    }
  }
}

TEST(TorchOracle, Torch26ReadsAndWritesNewDTypesAndSerializationId) {
  SP_REQUIRE_TORCH26_RUNNER(runner);
  testing::TempDir dir;
  auto r = testing::run_command(runner + " " + kOracle + " make " + dir.path().string() + " --new-dtypes 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  check_manifest(dir.path().string());
  // serialization_id: recompute PyTorch's value from the records it wrote
  for (const char* name : {"new_dtypes.pt", "nested.pt", "dtypes.pt"}) {
    auto f = TorchFile::open(dir.file(name));
    std::vector<std::pair<std::string, std::uint32_t>> recs;
    const ZipEntry* id = nullptr;
    for (const ZipEntry& e : f->archive().entries()) {
      std::string n = e.name.substr(f->archive_name().size() + 1);
      if (n == ".data/serialization_id") {
        id = &e;
      } else {
        recs.emplace_back(n, e.crc32);
      }
    }
    ASSERT_NE(id, nullptr);
    EXPECT_EQ(serialization_id(recs), f->archive().read(*id)) << name;
  }
  // the writer's v3 tensors load in 2.6
  std::vector<DType> all(std::begin(kAllDTypes), std::end(kAllDTypes));
  std::erase_if(all, [](DType d) { return d == DType::kFloat8_e8m0fnu; });  // not in 2.6
  WriterCase c = make_writer_case(all);
  std::string path = write_case(c, dir, "w26");
  auto k = testing::run_command(runner + " " + kOracle + " check " + path + " " + dir.file("w26.json") + " 2>&1");
  EXPECT_EQ(k.exit_code, 0) << k.output;
}

// torch.save (2.6) output, read and written back by shardpoint, is the same file byte for
// byte: zip layout, padding, record order, data.pkl opcodes and serialization_id.
TEST(TorchOracle, Torch26FilesRewriteByteIdentical) {
  SP_REQUIRE_TORCH26_RUNNER(runner);
  testing::TempDir dir;
  auto r = testing::run_command(runner + " " + kOracle + " make " + dir.path().string() + " --new-dtypes 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"tensor_root.pt", "stream.pt", "views.pt", "new_dtypes.pt", "dtypes.pt", "nested.pt"}) {
    SCOPED_TRACE(name);
    std::string from = dir.file(name), to = dir.file(std::string("copy_") + name);
    copy_through(from, to, true);
    std::string a = testing::read_text(from), b = testing::read_text(to);
    EXPECT_EQ(a.size(), b.size());
    std::size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    EXPECT_EQ(i, a.size()) << "first difference at offset " << i;
  }
}

}  // namespace
}  // namespace shardpoint::torchfile
