#include "torchfile/torch_save_writer.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "test_util.h"
#include "torchfile/torch_file.h"

namespace shardpoint::torchfile {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

TEST(MakeTensorNode, LegacyDTypesUseTypedStorageAndV2) {
  std::vector<std::int64_t> shape{2, 3}, strides{3, 1};
  ValuePtr n = make_tensor_node(DType::kBFloat16, shape, strides, 5, "7", 11, "cuda:0", true);
  ASSERT_TRUE(n->is(Kind::kObject));
  EXPECT_TRUE(n->callable()->is_global("torch._utils", "_rebuild_tensor_v2"));
  const auto& a = n->args()->items();
  ASSERT_EQ(a.size(), 6u);
  const auto& pid = a[0]->pid()->items();
  EXPECT_EQ(pid[0]->as_string(), "storage");
  EXPECT_TRUE(pid[1]->is_global("torch", "BFloat16Storage"));
  EXPECT_EQ(pid[2]->as_string(), "7");
  EXPECT_EQ(pid[3]->as_string(), "cuda:0");
  EXPECT_EQ(pid[4]->as_int(), 11);
  EXPECT_EQ(a[1]->as_int(), 5);
  EXPECT_EQ(a[2]->items().size(), 2u);
  EXPECT_EQ(a[2]->items()[1]->as_int(), 3);
  EXPECT_EQ(a[3]->items()[0]->as_int(), 3);
  EXPECT_TRUE(a[4]->as_bool());
  EXPECT_TRUE(a[5]->callable()->is_global("collections", "OrderedDict"));
  EXPECT_TRUE(a[5]->args()->items().empty());
}

TEST(MakeTensorNode, NewDTypesUseUntypedStorageAndV3) {
  std::vector<std::int64_t> shape{4}, strides{1};
  for (DType d : {DType::kUInt16, DType::kUInt32, DType::kUInt64, DType::kFloat8_e4m3fn, DType::kFloat8_e5m2,
                  DType::kComplex32}) {
    EXPECT_FALSE(uses_legacy_storage(d));
    ValuePtr n = make_tensor_node(d, shape, strides, 0, "0", 4);
    EXPECT_TRUE(n->callable()->is_global("torch._utils", "_rebuild_tensor_v3"));
    const auto& a = n->args()->items();
    ASSERT_EQ(a.size(), 7u);
    const auto& pid = a[0]->pid()->items();
    EXPECT_TRUE(pid[1]->is_global("torch.storage", "UntypedStorage"));
    EXPECT_EQ(pid[4]->as_int(), static_cast<std::int64_t>(4 * dtype_itemsize(d)));  // bytes
    EXPECT_TRUE(a[6]->is_global("torch", dtype_name(d)));
  }
  for (DType d :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kComplex64, DType::kComplex128,
        DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64, DType::kUInt8, DType::kBool}) {
    EXPECT_TRUE(uses_legacy_storage(d)) << dtype_name(d);
  }
  EXPECT_THROW(make_tensor_node(DType::kFloat32, shape, std::vector<std::int64_t>{}, 0, "0", 4), UsageError);
  EXPECT_THROW(make_tensor_node(DType::kFloat32, shape, strides, -1, "0", 4), UsageError);
}

TEST(ContiguousStrides, RowMajor) {
  EXPECT_EQ(contiguous_strides(std::vector<std::int64_t>{2, 3, 4}), (std::vector<std::int64_t>{12, 4, 1}));
  EXPECT_EQ(contiguous_strides(std::vector<std::int64_t>{}), (std::vector<std::int64_t>{}));
  EXPECT_EQ(contiguous_strides(std::vector<std::int64_t>{0, 3}), (std::vector<std::int64_t>{3, 1}));
}

TEST(SerializationId, FortyDigitsDeterministicAndSensitive) {
  std::vector<std::pair<std::string, std::uint32_t>> r{
      {"data.pkl", 1}, {"byteorder", 2}, {"data/0", 3}, {"version", 4}};
  std::string a = serialization_id(r);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(a, serialization_id(r));
  r[2].second = 5;
  EXPECT_NE(a.substr(20), serialization_id(r).substr(20));
  EXPECT_EQ(a.substr(0, 20), serialization_id(r).substr(0, 20));
  // crc part: hash_combine folded from 0
  std::uint64_t h = 0;
  for (std::uint64_t c : {1, 2, 5, 4}) h = h ^ (c + 0x9e3779b9 + (h << 6) + (h >> 2));
  char buf[21];
  std::snprintf(buf, sizeof buf, "%020llu", static_cast<unsigned long long>(h));
  EXPECT_EQ(serialization_id(r).substr(20), buf);
}

TEST(TorchSaveWriter, UsageErrors) {
  std::vector<std::int64_t> shape{2}, strides{1};
  ValuePtr root = Value::dict({{Value::str("a"), make_tensor_node(DType::kFloat32, shape, strides, 0, "0", 2)},
                               {Value::str("b"), make_tensor_node(DType::kUInt16, shape, strides, 0, "1", 2)}});
  StringSink sink;
  TorchSaveWriter w(sink);
  EXPECT_THROW(w.begin_storage("0", 8), UsageError);
  EXPECT_THROW(w.finish(), UsageError);
  w.write_pickle(*root);
  EXPECT_THROW(w.write_pickle(*root), UsageError);
  EXPECT_EQ(w.pending_storages().size(), 2u);
  EXPECT_EQ(w.pending_storages().at("1"), 4u);
  EXPECT_THROW(w.begin_storage("9", 8), UsageError);
  EXPECT_THROW(w.begin_storage("0", 7), UsageError);
  w.write_storage("0", as_bytes(std::string(8, 'x')));
  EXPECT_THROW(w.write_storage("0", as_bytes(std::string(8, 'x'))), UsageError);
  EXPECT_THROW(w.finish(), UsageError);  // "1" missing
  w.write_storage("1", as_bytes(std::string(4, 'y')));
  w.finish();
  EXPECT_THROW(w.finish(), UsageError);
  auto f = TorchFile::open(std::make_unique<MemorySource>(as_bytes(sink.str()), "w.pt"));
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[1].dtype, DType::kUInt16);
  EXPECT_EQ(f->tensors()[1].storage_numel, 2u);
  TorchSaveOptions slash;
  slash.archive_name = "a/b";
  EXPECT_THROW(TorchSaveWriter(sink, slash), UsageError);
}

// The CRC-32s the writer records (central directory and data descriptors) are the data's,
// as readers independent of ours compute them: Python's zipfile (testzip() reads every
// member and checks its CRC) and Info-ZIP's `unzip -t` when installed. Storages written in
// pieces, one larger than the writers' buffers, an empty one.
TEST(TorchSaveWriter, IndependentZipReadersFindEveryCrcCorrect) {
  std::vector<std::int64_t> big_shape{3 << 18}, small_shape{5}, empty_shape{0};
  std::vector<std::int64_t> strides{1};
  ValuePtr root =
      Value::dict({{Value::str("big"), make_tensor_node(DType::kFloat32, big_shape, strides, 0, "0", 3 << 18)},
                   {Value::str("small"), make_tensor_node(DType::kInt64, small_shape, strides, 0, "1", 5)},
                   {Value::str("empty"), make_tensor_node(DType::kFloat32, empty_shape, strides, 0, "2", 0)}});
  testing::TempDir dir;
  for (bool force64 : {false, true}) {
    StringSink sink;
    TorchSaveOptions options;
    options.zip.force_zip64 = force64;
    TorchSaveWriter w(sink, options);
    w.write_pickle(*root);
    w.begin_storage("0", std::uint64_t{4} * (3 << 18));
    std::string piece(65537, '\0');
    for (std::uint64_t done = 0; done < std::uint64_t{4} * (3 << 18);) {
      const std::size_t n =
          static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), std::uint64_t{4} * (3 << 18) - done));
      for (std::size_t i = 0; i < n; ++i) piece[i] = static_cast<char>((done + i) * 131 % 251);
      w.write(as_bytes(std::string_view(piece).substr(0, n)));
      done += n;
    }
    w.end_storage();
    w.write_storage("1", as_bytes(std::string(40, 'q')));
    w.write_storage("2", ByteSpan{});
    w.finish();
    const std::string path = dir.file(force64 ? "w64.pt" : "w.pt");
    testing::write_text(path, sink.str());
    auto py = testing::run_command(
        "/usr/bin/python3 -c \"import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); bad=z.testzip(); "
        "print(bad if bad else 'ok', len(z.infolist()))\" " +
        path + " 2>&1");
    EXPECT_EQ(py.exit_code, 0) << py.output;
    EXPECT_EQ(py.output.rfind("ok ", 0), 0u) << py.output;
    if (testing::run_command("command -v unzip >/dev/null 2>&1").exit_code == 0) {
      auto uz = testing::run_command("unzip -tq " + path + " 2>&1");
      EXPECT_EQ(uz.exit_code, 0) << uz.output;
      EXPECT_NE(uz.output.find("No errors detected"), std::string::npos) << uz.output;
    }
  }
}

}  // namespace
}  // namespace shardpoint::torchfile
