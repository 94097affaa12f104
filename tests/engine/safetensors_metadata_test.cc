// Safetensors checkpoints in the engine: a Hugging Face folder (per-rank shard files with
// DCP_SHARDING_INFO, as HuggingFaceStorageWriter lays them out) read as Metadata, loaded on
// 3 ranks and read by CheckpointReader; folders whose files disagree refused naming file and
// tensor. (PyTorch-written folders: python/tests/test_safetensors.py.)
#include "engine/safetensors_metadata.h"

#include <gtest/gtest.h>

#include <cstring>

#include "comm/thread_communicator.h"
#include "engine/folder_metadata.h"
#include "format/safetensors_writer.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/error.h"
#include "storage/memory_storage.h"

namespace shardpoint::engine {
namespace {

// Element i of "w" (float32 [6, 4]) is i; "b" (int16 [3]) is 100 + i.
std::string w_rows(int begin, int end) {
  std::string out;
  for (int i = begin * 4; i < end * 4; ++i) {
    const float v = static_cast<float>(i);
    out.append(reinterpret_cast<const char*>(&v), 4);
  }
  return out;
}
std::string b_values() {
  std::string out;
  for (std::int16_t i = 0; i < 3; ++i) {
    const std::int16_t v = static_cast<std::int16_t>(100 + i);
    out.append(reinterpret_cast<const char*>(&v), 2);
  }
  return out;
}

void put_file(storage::Storage& st, const std::string& key, std::vector<format::SafetensorsEntry> entries,
              const std::string& data, const std::string& sharding) {
  StringSink sink;
  std::map<std::string, std::string> meta{{"format", "pt"}, {"DCP_VERSION", "1.0"}};
  if (!sharding.empty()) meta["DCP_SHARDING_INFO"] = sharding;
  format::SafetensorsWriter writer(sink, std::move(entries), meta);
  writer.write(as_bytes(data));
  writer.finish();
  st.write_atomic(key, as_bytes(sink.str()));
}

// Rows 0:4 of "w" and all of "b" in rank 1's file, rows 4:6 in rank 2's.
std::shared_ptr<storage::Storage> sharded_folder() {
  auto st = storage::open_memory_storage(Location::parse("memory://"), {});
  put_file(*st, "shard-00001-model-00001-of-00001.safetensors",
           {{"w", DType::kFloat32, {4, 4}}, {"b", DType::kInt16, {3}}}, w_rows(0, 4) + b_values(),
           R"({"w": {"saved_offsets": [0, 0]}, "b": {"saved_offsets": [0]}})");
  put_file(*st, "shard-00002-model-00001-of-00001.safetensors", {{"w", DType::kFloat32, {2, 4}}}, w_rows(4, 6),
           R"({"w": {"saved_offsets": [4, 0]}})");
  return st;
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(SafetensorsMetadataTest, ShardFilesBecomeChunksWithRawItems) {
  auto st = sharded_folder();
  const format::Metadata md = read_hf_metadata(*st);
  const auto& w = std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at("w"));
  EXPECT_EQ(w.size, (Shape{6, 4}));
  EXPECT_EQ(w.properties.dtype, DType::kFloat32);
  ASSERT_EQ(w.chunks.size(), 2u);
  EXPECT_EQ(w.chunks[1], (format::ChunkStorageMetadata{{4, 0}, {2, 4}}));
  const format::StorageInfo& info = md.storage_data.at({"w", Shape{4, 0}, std::nullopt});
  EXPECT_EQ(info.relative_path, "shard-00002-model-00001-of-00001.safetensors");
  EXPECT_EQ(info.length, 32u);
  // The item's bytes are the rows themselves.
  std::string bytes(32, '\0');
  st->read(info.relative_path, info.offset, std::as_writable_bytes(std::span<char>(bytes)));
  EXPECT_EQ(bytes, w_rows(4, 6));
  EXPECT_EQ(md.key_order, (std::vector<std::string>{"w", "b"}));
  EXPECT_EQ(folder_kind(*st), CheckpointKind::kHfSafetensors);
  EXPECT_TRUE(read_folder_metadata(*st).raw_tensor_items);
}

TEST(SafetensorsMetadataTest, LoadsOnThreeRanksAndReadsBoxes) {
  auto st = sharded_folder();
  comm::ThreadGroup group(3, comm::CommOptions{std::chrono::seconds(20)});
  std::vector<std::string> got_w(3), got_b(3);
  group.run([&](comm::Communicator& comm) {
    const int r = comm.rank();
    got_w[r].assign(32, '\0');  // 2 rows of 4 float32
    got_b[r].assign(6, '\0');
    TensorShard w;
    w.dtype = DType::kFloat32;
    w.global_shape = {6, 4};
    w.offsets = {2 * std::int64_t{r}, 0};
    w.sizes = {2, 4};
    w.data = std::as_writable_bytes(std::span<char>(got_w[r]));
    TensorShard b;
    b.dtype = DType::kInt16;
    b.global_shape = b.sizes = {3};
    b.offsets = {0};
    b.data = std::as_writable_bytes(std::span<char>(got_b[r]));
    StateNode state;
    state.set("w", StateNode(w));
    state.set("b", StateNode(b));
    load(state, *st, comm);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got_w[r], w_rows(2 * r, 2 * r + 2)) << "rank " << r;
    EXPECT_EQ(got_b[r], b_values()) << "rank " << r;
  }
  CheckpointReader reader(*st);
  EXPECT_TRUE(reader.raw_tensor_items());
  std::string box(16, '\0');  // rows 3:5, columns 1:3 (2 x 2 float32): across both files
  reader.read_box("w", {3, 1}, {2, 2}, std::as_writable_bytes(std::span<char>(box)));
  std::string want;
  for (int row : {3, 4}) want += w_rows(row, row + 1).substr(4, 8);
  EXPECT_EQ(box, want);
}

TEST(SafetensorsMetadataTest, IndexMustNameTheFileOfEachTensor) {
  auto st = sharded_folder();
  st->write_atomic(
      kHfIndexKey,
      as_bytes(std::string(R"({"metadata": {"total_size": 102}, "weight_map": {"w": "elsewhere.safetensors"}})")));
  EXPECT_EQ(message_of([&] { read_hf_metadata(*st); }),
            st->describe_key(kHfIndexKey) + ": weight_map puts tensor \"w\" in \"elsewhere.safetensors\", found "
                                            "it in \"shard-00002-model-00001-of-00001.safetensors\"");
  st->write_atomic(kHfIndexKey, as_bytes(std::string(R"({"weight_map": [[[[[]]]]]})")));
  EXPECT_NE(message_of([&] { read_hf_metadata(*st); }).find("nested deeper"), std::string::npos);
}

TEST(SafetensorsMetadataTest, DisagreeingFilesAreRefused) {
  auto st = sharded_folder();
  put_file(*st, "shard-00003-model-00001-of-00001.safetensors", {{"w", DType::kFloat32, {2, 4}}}, w_rows(4, 6),
           R"({"w": {"saved_offsets": [4, 0]}})");
  EXPECT_EQ(message_of([&] { read_hf_metadata(*st); }),
            st->describe_key("shard-00003-model-00001-of-00001.safetensors") +
                ": tensor \"w\" chunk at [4, 0]: also in "
                "\"shard-00002-model-00001-of-00001.safetensors\"");
  st->remove("shard-00003-model-00001-of-00001.safetensors");
  put_file(*st, "shard-00003-model-00001-of-00001.safetensors", {{"b", DType::kFloat32, {1}}}, std::string(4, '\0'),
           R"({"b": {"saved_offsets": [3]}})");
  EXPECT_EQ(message_of([&] { read_hf_metadata(*st); }),
            st->describe_key("shard-00003-model-00001-of-00001.safetensors") +
                ": tensor \"b\": float32 of rank 1, another file "
                "holds it as int16 of rank 1");
  st->remove("shard-00003-model-00001-of-00001.safetensors");
  put_file(*st, "shard-00003-model-00001-of-00001.safetensors", {{"c", DType::kFloat32, {1}}}, std::string(4, '\0'),
           R"({"b": {"saved_offsets": [0]}})");
  EXPECT_NE(message_of([&] { read_hf_metadata(*st); }).find("names tensor \"b\", which the header lacks"),
            std::string::npos);
}

TEST(SafetensorsMetadataTest, EmptyFolderIsNotACheckpoint) {
  auto st = storage::open_memory_storage(Location::parse("memory://"), {});
  EXPECT_EQ(folder_kind(*st), CheckpointKind::kDcp);
  EXPECT_NE(message_of([&] { read_folder_metadata(*st); }).find("not a committed checkpoint (no .metadata)"),
            std::string::npos);
}

TEST(SafetensorsMetadataTest, ResolvesDcpSafetensorsItemsAndRefusesMixedOnes) {
  // One rank file as FileSystemWriter(serialization_format=SAFETENSORS) writes it: the
  // safetensors blob after 10 bytes of other items, every tensor item's offset at the blob.
  auto st = storage::open_memory_storage(Location::parse("memory://"), {});
  StringSink sink;
  format::SafetensorsWriter writer(sink, {{"w", DType::kFloat32, {6, 4}}, {"b", DType::kInt16, {3}}});
  writer.write(as_bytes(w_rows(0, 6) + b_values()));
  writer.finish();
  st->write_atomic("__0_0.distcp", as_bytes(std::string(10, 'x') + sink.str()));
  format::Metadata md;
  format::TensorStorageMetadata w;
  w.size = {6, 4};
  w.chunks = {{{0, 0}, {6, 4}}};
  format::TensorStorageMetadata b;
  b.properties.dtype = DType::kInt16;
  b.size = {3};
  b.chunks = {{{0}, {3}}};
  md.state_dict_metadata = {{"w", w}, {"b", b}};
  md.storage_data[{"w", Shape{0, 0}, std::nullopt}] = {"__0_0.distcp", 10, 96, {}};
  md.storage_data[{"b", Shape{0}, std::nullopt}] = {"__0_0.distcp", 10, 6, {}};
  format::Metadata resolved = md;
  ASSERT_TRUE(resolve_safetensors_items(resolved, *st));
  const format::StorageInfo& info = resolved.storage_data.at({"b", Shape{0}, std::nullopt});
  std::string bytes(6, '\0');
  st->read("__0_0.distcp", info.offset, std::as_writable_bytes(std::span<char>(bytes)));
  EXPECT_EQ(bytes, b_values());
  // The header's shape must be the chunk's, not only its byte count.
  format::Metadata transposed = md;
  std::get<format::TensorStorageMetadata>(transposed.state_dict_metadata.at("w")).size = {4, 6};
  std::get<format::TensorStorageMetadata>(transposed.state_dict_metadata.at("w")).chunks = {{{0, 0}, {4, 6}}};
  transposed.storage_data.erase({"w", Shape{0, 0}, std::nullopt});
  transposed.storage_data[{"w", Shape{0, 0}, std::nullopt}] = {"__0_0.distcp", 10, 96, {}};
  EXPECT_EQ(message_of([&] { resolve_safetensors_items(transposed, *st); }),
            st->describe_key("__0_0.distcp") +
                ": safetensors blob at 10: item \"w\": .metadata says float32 [4, 6], 96 bytes; the header float32 [6, "
                "4], 96 bytes");
  // A torch.save blob is longer than its tensor: one such item after a safetensors one. (An
  // ordinary checkpoint's first tensor item decides at once that nothing is to resolve.)
  md.storage_data[{"w", Shape{0, 0}, std::nullopt}].length = 700;
  EXPECT_EQ(message_of([&] { resolve_safetensors_items(md, *st); }),
            ".metadata: 1 tensor items are safetensors and 1 are torch.save blobs; a DCP checkpoint has one "
            "serialization format");
}

}  // namespace
}  // namespace shardpoint::engine
