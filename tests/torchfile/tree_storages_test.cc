// tree_storages: an object cut out of a torch.save tree written alone, as torch.save writes
// it: storages renumbered in pickler order (shared storages keep one key), views kept, bytes
// copied (big-endian archives swapped to little-endian); bad persistent ids refused.
#include "torchfile/tree_storages.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/byte_io.h"
#include "pickle/writer.h"
#include "shardpoint/error.h"
#include "torch_test_util.h"
#include "torchfile/zip_writer.h"

namespace shardpoint::torchfile {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

std::string archive_of(const Value& root, const std::vector<std::pair<std::string, std::string>>& records) {
  StringSink sink;
  ZipWriter w(sink);
  w.write_record("archive/data.pkl", pickle::pickle_to_string(root));
  for (const auto& [n, d] : records) w.write_record(n, d);
  w.finish();
  return sink.take();
}

std::string written_alone(const Value& object, const TorchFile& file) {
  StringSink sink;
  TorchSaveWriter writer(sink);
  write_object_with_storages(writer, object, file);
  writer.finish();
  return sink.take();
}

TEST(TreeStorages, ObjectWrittenAloneGetsTorchSaveKeysAndItsBytes) {
  const std::vector<std::int64_t> two{2}, one{1};
  // Storage "7": 4 floats; "a" is a view of its elements 1..2, the namespace's tensor a view
  // of element 3. Storage "3" (int64) belongs to another key of the file.
  ValuePtr view_a = make_tensor_node(DType::kFloat32, two, one, 1, "7", 4);
  ValuePtr view_b = make_tensor_node(DType::kFloat32, one, one, 3, "7", 4);
  ValuePtr other = make_tensor_node(DType::kInt64, one, one, 0, "3", 1);
  ValuePtr ns = Value::object(pickle::CallKind::kNewObj, Value::global("types", "SimpleNamespace"), Value::tuple());
  ns->set_state(Value::dict({{Value::str("d"), Value::dict({{Value::str("t"), view_b}})}}));
  ValuePtr bf16 = make_tensor_node(DType::kBFloat16, two, one, 0, "9", 2);
  ValuePtr object = Value::tuple({view_a, Value::str("l2"), ns, bf16});
  ValuePtr root = Value::dict({{Value::str("other"), other}, {Value::str("pair"), object}});
  const std::string floats = test::pattern_bytes(16, 1), longs = test::pattern_bytes(8, 2);
  const std::string halves = test::pattern_bytes(4, 3);
  const std::string z = archive_of(*root, {{"archive/byteorder", "little"},
                                           {"archive/data/3", longs},
                                           {"archive/data/7", floats},
                                           {"archive/data/9", halves},
                                           {"archive/version", "3\n"}});
  auto file = TorchFile::open(std::make_unique<MemorySource>(as_bytes(z), "src.pt"));
  const std::string before = pickle::pickle_to_string(*file->root());

  const std::string out = written_alone(*file->root()->get("pair"), *file);
  EXPECT_EQ(pickle::pickle_to_string(*file->root()), before) << "the source tree was modified";
  auto alone = TorchFile::open(std::make_unique<MemorySource>(as_bytes(out), "alone.pt"));
  ASSERT_EQ(alone->tensors().size(), 3u);
  const TensorInfo* a = alone->tensor_of(*alone->root()->items()[0]);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->storage_key, "0");
  EXPECT_EQ(a->storage_offset, 1);
  EXPECT_EQ(a->shape, two);
  EXPECT_EQ(test::tensor_sha256(*alone, *a), test::sha256_of(floats.substr(4, 8)));
  const ValuePtr& ns_state = alone->root()->items()[2]->state();
  const TensorInfo* b = alone->tensor_of(*ns_state->get("d")->get("t"));
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->storage_key, "0");  // one storage, one key
  EXPECT_EQ(b->storage_offset, 3);
  const TensorInfo* h = alone->tensor_of(*alone->root()->items()[3]);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->storage_key, "1");
  EXPECT_EQ(h->dtype, DType::kBFloat16);
  EXPECT_EQ(alone->storages().size(), 2u);  // storage "3" is not the object's
  EXPECT_EQ(alone->archive().read(*alone->record("data/0")), floats);
  EXPECT_EQ(alone->archive().read(*alone->record("data/1")), halves);
  EXPECT_EQ(alone->root()->items()[1]->as_string(), "l2");
}

TEST(TreeStorages, BigEndianStoragesAreWrittenLittleEndian) {
  const std::vector<std::int64_t> two{2}, one{1};
  ValuePtr root = Value::tuple({make_tensor_node(DType::kFloat32, two, one, 0, "0", 2),
                                make_tensor_node(DType::kComplex64, one, one, 0, "1", 1)});
  const std::string be("\x3f\x80\x00\x00\xc0\x40\x00\x00", 8);  // 1, -3
  const std::string le("\x00\x00\x80\x3f\x00\x00\x40\xc0", 8);
  const std::string z = archive_of(
      *root,
      {{"archive/byteorder", "big"}, {"archive/data/0", be}, {"archive/data/1", be}, {"archive/version", "3\n"}});
  auto file = TorchFile::open(std::make_unique<MemorySource>(as_bytes(z), "be.pt"));
  const std::string out = written_alone(*file->root(), *file);
  auto alone = TorchFile::open(std::make_unique<MemorySource>(as_bytes(out), "alone.pt"));
  EXPECT_FALSE(alone->big_endian());
  EXPECT_EQ(alone->archive().read(*alone->record("data/0")), le);
  EXPECT_EQ(alone->archive().read(*alone->record("data/1")), le);  // each half of 1-3j swapped
}

TEST(TreeStorages, BadPersistentIdsAndRecordsAreFormatErrors) {
  auto pid = [](std::vector<ValuePtr> items) { return Value::persistent_id(Value::tuple(std::move(items))); };
  ValuePtr good = pid({Value::str("storage"), Value::global("torch", "FloatStorage"), Value::integer(5),
                       Value::str("cpu"), Value::integer(3)});
  StorageRef ref = parse_storage_pid(*good, "x");
  EXPECT_EQ(ref.key, "5");
  EXPECT_EQ(ref.nbytes, 12u);
  EXPECT_EQ(ref.swap_width, 4u);
  ValuePtr untyped = pid({Value::str("storage"), Value::global("torch", "UntypedStorage"), Value::str("0"),
                          Value::str("cpu"), Value::integer(6)});
  EXPECT_EQ(parse_storage_pid(*untyped, "x").nbytes, 6u);
  EXPECT_EQ(parse_storage_pid(*untyped, "x").swap_width, 1u);
  ValuePtr renamed = rename_storage_pid(*good, Value::str("0"));
  EXPECT_EQ(renamed->pid()->items()[2]->as_string(), "0");
  EXPECT_EQ(renamed->pid()->items()[1], good->pid()->items()[1]);

  for (const ValuePtr& bad : {pid({Value::str("storage")}),
                              pid({Value::str("tensor"), Value::global("torch", "FloatStorage"), Value::str("0"),
                                   Value::str("cpu"), Value::integer(1)}),
                              pid({Value::str("storage"), Value::global("torch", "QInt8Storage"), Value::str("0"),
                                   Value::str("cpu"), Value::integer(1)}),
                              pid({Value::str("storage"), Value::global("torch", "FloatStorage"), Value::str("0"),
                                   Value::str("cpu"), Value::integer(-1)}),
                              Value::persistent_id(Value::str("storage"))}) {
    EXPECT_THROW(parse_storage_pid(*bad, "x"), FormatError);
  }

  // A storage record shorter than the persistent id says.
  ValuePtr root = Value::tuple({good});
  const std::string z = archive_of(*root, {{"archive/data/5", "1234"}, {"archive/version", "3\n"}});
  auto file = TorchFile::open(std::make_unique<MemorySource>(as_bytes(z), "short.pt"));
  try {
    written_alone(*file->root(), *file);
    FAIL() << "expected a FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("short.pt: storage \"5\": expected 12 bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardpoint::torchfile
