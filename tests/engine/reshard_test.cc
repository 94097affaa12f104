// reshard() in one process, on MemoryStorage sources and destinations and local torch.save
// files: N -> M for several world sizes (loaded back on M ranks with every value checked),
// the report's counts, the output's layout (Shard(0) boxes, replicated tensors once, files
// __r_0.distcp), a torch.save source converted with ranks = 1 and 2, the memory budget
// setting the slabs, a bytes item whose object holds tensors, Lightning's meta.pt carried
// over (a damaged one refused, a failed write of it uncommitting the output), and the
// usage errors.
#include "shardpoint/reshard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "comm/thread_communicator.h"
#include "engine/checkpoint_test_state.h"
#include "engine/object_item_checkpoint.h"
#include "engine/torch_save.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/memory_storage.h"
#include "storage/storage_wrapper.h"
#include "test_util.h"

namespace shardpoint::engine {
namespace {

using testing::compare_with_expected;
using testing::make_rank_state;
using testing::RankState;
using testing::tensor_specs;

comm::CommOptions fast() { return comm::CommOptions{std::chrono::seconds(20)}; }

std::string unique_url(const std::string& name) {
  return "memory://" + shardpoint::testing::unique_name("reshard-" + name);
}

void save_on(int world, storage::Storage& st) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, true));
  comm::ThreadGroup group(world, fast());
  group.run([&](comm::Communicator& comm) { save(states[comm.rank()].root, st, comm); });
}

// Loads `st` on `world` ranks into make_rank_state templates (dim-1 and replicated layouts
// included: load reshards) and checks every value.
void load_and_check(int world, storage::Storage& st) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, false));
  comm::ThreadGroup group(world, fast());
  group.run([&](comm::Communicator& comm) { load(states[comm.rank()].root, st, comm); });
  for (int r = 0; r < world; ++r)
    EXPECT_EQ(compare_with_expected(states[r], r, world), "") << "rank " << r << " of " << world;
}

std::uint64_t payload_bytes() {
  std::uint64_t n = 0;
  for (const auto& s : tensor_specs()) n += static_cast<std::uint64_t>(volume(s.shape)) * dtype_itemsize(s.dtype);
  return n;
}

TEST(ReshardTest, EveryWorldSizeLoadsBackExactly) {
  for (int from : {1, 2, 3}) {
    const std::string source = unique_url("src");
    save_on(from, *storage::open_storage(source));
    for (int to : {1, 2, 4}) {
      auto dst = storage::open_storage(unique_url("dst"));
      ReshardOptions options;
      options.ranks = to;
      const ReshardReport report = reshard(source, *dst, options);
      EXPECT_EQ(report.source_format, CheckpointKind::kDcp);
      EXPECT_EQ(report.tensors, tensor_specs().size());
      EXPECT_EQ(report.payload_bytes, payload_bytes()) << from << " -> " << to;
      EXPECT_EQ(report.copied_bytes, payload_bytes()) << from << " -> " << to;
      EXPECT_GT(report.bytes_written, report.payload_bytes);
      for (int r = 0; r < to; ++r) EXPECT_TRUE(dst->try_stat("__" + std::to_string(r) + "_0.distcp")) << r;
      EXPECT_TRUE(dst->try_stat(kChecksumSidecar));
      load_and_check(3, *dst);
      load_and_check(to, *dst);
    }
  }
}

// Sharded tensors are split on dim 0 in ceil(n / ranks) rows; model.c (dim-1 sharded in the
// source) too; replicated-looking tensors and 0-dim ones are one chunk.
TEST(ReshardTest, OutputChunksAreShardZeroBoxes) {
  const std::string source = unique_url("layout-src");
  save_on(2, *storage::open_storage(source));
  auto dst = storage::open_storage(unique_url("layout-dst"));
  ReshardOptions options;
  options.ranks = 4;
  reshard(source, *dst, options);
  const format::Metadata md = read_metadata(*dst);
  auto chunks = [&](const std::string& fqn) {
    return std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at(fqn)).chunks;
  };
  std::vector<format::ChunkStorageMetadata> w = chunks("model.w");
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[0], (format::ChunkStorageMetadata{{0, 0}, {3, 3}}));
  EXPECT_EQ(w[3], (format::ChunkStorageMetadata{{9, 0}, {1, 3}}));
  std::vector<format::ChunkStorageMetadata> c = chunks("model.c");
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[1], (format::ChunkStorageMetadata{{1, 0}, {1, 7}}));
  EXPECT_EQ(chunks("model.rep").size(), 1u);
  EXPECT_EQ(chunks("model.scalar").size(), 1u);
}

// Each file writer's slab is memory_budget_bytes / parallel_files, never under 64 KiB (so a
// tiny budget does not turn into tiny reads).
TEST(ReshardTest, BudgetSetsTheSlabs) {
  const std::string source = unique_url("budget-src");
  save_on(2, *storage::open_storage(source));
  for (std::uint64_t budget : {std::uint64_t{64}, std::uint64_t{1} << 20}) {
    auto dst = storage::open_storage(unique_url("budget-dst"));
    ReshardOptions options;
    options.ranks = 2;
    options.memory_budget_bytes = budget;
    options.parallel_files = 2;
    const ReshardReport report = reshard(source, *dst, options);
    EXPECT_EQ(report.slab_bytes, std::max<std::uint64_t>(std::uint64_t{64} << 10, budget / 2)) << budget;
    load_and_check(2, *dst);
  }
}

// A torch.save file of whole tensors (what consolidate writes) becomes a DCP checkpoint.
TEST(ReshardTest, TorchSaveSourceConverts) {
  shardpoint::testing::TempDir dir;
  RankState whole = make_rank_state(0, 1, true);
  StringSink sink;
  write_torch_save(whole.root, sink);
  const std::string path = dir.file("full.pt");
  shardpoint::testing::write_text(path, sink.str());
  for (int ranks : {1, 2}) {
    auto dst = storage::open_storage(unique_url("torch-dst"));
    ReshardOptions options;
    options.ranks = ranks;
    const ReshardReport report = reshard(path, *dst, options);
    EXPECT_EQ(report.source_format, CheckpointKind::kTorchSave);
    EXPECT_EQ(report.tensors, tensor_specs().size());
    EXPECT_EQ(report.payload_bytes, payload_bytes());
    // Every tensor reads back whole as saved.
    CheckpointReader reader(*dst);
    for (const auto& s : tensor_specs()) {
      std::vector<std::byte> got(static_cast<std::size_t>(volume(s.shape)) * dtype_itemsize(s.dtype));
      reader.read_box(s.path, format::Shape(s.shape.size(), 0), s.shape, got);
      EXPECT_EQ(got, testing::box_bytes(s, Box{format::Shape(s.shape.size(), 0), s.shape}))
          << s.path << " ranks " << ranks;
    }
    EXPECT_TRUE(pickle::deep_equal(*reader.read_object("epoch"), *pickle::Value::integer(7)));
  }
}

// A bytes item whose object holds tensors comes out as the same object with its storage
// record (one record for both views), on any number of ranks. (Byte equality with
// PyTorch's own items is checked against PyTorch in tests/cli/object_items_test.cc.)
TEST(ReshardTest, ObjectItemHoldingTensorsIsWrittenWithItsStorage) {
  const std::string source = unique_url("object-src");
  const testing::ObjectItemCheckpoint c = testing::write_object_item_checkpoint(*storage::open_storage(source));
  auto original = torchfile::TorchFile::open(std::make_unique<MemorySource>(as_bytes(c.pair_blob), "pair"));
  for (int to : {1, 3}) {
    auto dst = storage::open_storage(unique_url("object-dst"));
    ReshardOptions options;
    options.ranks = to;
    const ReshardReport report = reshard(source, *dst, options);
    EXPECT_EQ(report.objects, 1u);
    CheckpointReader reader(*dst);
    std::shared_ptr<const torchfile::TorchFile> item = reader.read_object_file("pair");
    EXPECT_TRUE(pickle::deep_equal(*item->root(), *original->root())) << to << " ranks";
    ASSERT_EQ(item->tensors().size(), 2u);
    EXPECT_EQ(item->tensors()[0].storage_key, "0");
    EXPECT_EQ(item->tensors()[1].storage_key, "0");
    EXPECT_EQ(item->storages().size(), 1u);
    EXPECT_EQ(item->archive().read(*item->record("data/0")), c.pair_storage);
    std::vector<std::byte> w(24);
    reader.read_box("w", {0, 0}, {2, 3}, w);
    EXPECT_EQ(std::memcmp(w.data(), c.w_bytes.data(), w.size()), 0);
  }
}

// A small torch.save file standing for Lightning's meta.pt (the real one, written by
// Lightning, is carried in python/tests/test_lightning_model_parallel.py).
std::string meta_pt_bytes() {
  StateNode root{StateDict{}};
  root.set("epoch", StateNode(pickle::Value::integer(0)));
  root.set("global_step", StateNode(pickle::Value::integer(2)));
  root.set("pytorch-lightning_version", StateNode(pickle::Value::str("2.6.6")));
  StringSink sink;
  write_torch_save(root, sink, TorchSaveFileOptions{"meta"});
  return sink.str();
}

TEST(ReshardTest, LightningMetaPtIsCarriedAfterMetadata) {
  const std::string source = unique_url("meta-src");
  auto src = storage::open_storage(source);
  save_on(2, *src);
  const std::string meta = meta_pt_bytes();
  src->write_atomic("meta.pt", as_bytes(meta));
  auto dst = storage::open_storage(unique_url("meta-dst"));
  ReshardOptions options;
  options.ranks = 3;
  const ReshardReport report = reshard(source, *dst, options);
  EXPECT_EQ(report.meta_pt_bytes, meta.size());
  EXPECT_EQ(dst->try_read_all("meta.pt"), meta);
  EXPECT_GE(report.zip_crc.records_checked, 3u);  // data.pkl, version, byteorder, ... of meta.pt
  load_and_check(3, *dst);
  // Without meta.pt there is none in the output.
  auto plain = storage::open_storage(unique_url("meta-plain"));
  src->remove("meta.pt");
  EXPECT_EQ(reshard(source, *plain, options).meta_pt_bytes, 0u);
  EXPECT_FALSE(plain->try_stat("meta.pt"));
}

// Fails the write of meta.pt, after noting whether `.metadata` was committed by then.
class FailingMetaPtStorage final : public storage::StorageWrapper {
 public:
  using StorageWrapper::StorageWrapper;
  void write_atomic(std::string_view key, ByteSpan data, const storage::WriteOptions& options,
                    const storage::IoOptions& io) override {
    if (key == "meta.pt") {
      metadata_before_meta_pt = target().try_stat(kMetadataKey).has_value();
      throw StorageError(StorageError::Kind::kOther, "meta.pt: injected write failure");
    }
    target().write_atomic(key, data, options, io);
  }
  bool metadata_before_meta_pt = false;
};

TEST(ReshardTest, FailedMetaPtWriteLeavesNoCheckpoint) {
  const std::string source = unique_url("fail-meta-src");
  auto src = storage::open_storage(source);
  save_on(2, *src);
  src->write_atomic("meta.pt", as_bytes(meta_pt_bytes()));
  auto target = std::shared_ptr<storage::Storage>(storage::open_storage(unique_url("fail-meta-dst")));
  FailingMetaPtStorage dst(target);
  ReshardOptions options;
  options.ranks = 2;
  EXPECT_THROW(reshard(source, dst, options), StorageError);
  EXPECT_TRUE(dst.metadata_before_meta_pt);  // Lightning's order: the DCP commit first
  EXPECT_TRUE(target->list("").empty());     // then uncommitted and removed again
}

TEST(ReshardTest, DamagedMetaPtFailsBeforeAnythingIsWritten) {
  const std::string source = unique_url("bad-meta-src");
  auto src = storage::open_storage(source);
  save_on(1, *src);
  std::string meta = meta_pt_bytes();
  const std::size_t at = meta.find("global_step");
  ASSERT_NE(at, std::string::npos);
  meta[at] = 'G';  // inside data.pkl: its CRC-32 no longer matches
  src->write_atomic("meta.pt", as_bytes(meta));
  auto dst = storage::open_storage(unique_url("bad-meta-dst"));
  try {
    reshard(source, *dst, ReshardOptions{});
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("meta.pt"), std::string::npos) << what;
    EXPECT_NE(what.find("CRC-32"), std::string::npos) << what;
  }
  EXPECT_TRUE(dst->list("").empty());
  ReshardOptions unchecked;
  unchecked.check_zip_crc = false;  // copied as it is when asked not to check
  EXPECT_EQ(reshard(source, *dst, unchecked).meta_pt_bytes, meta.size());
}

TEST(ReshardTest, UsageErrors) {
  const std::string source = unique_url("usage-src");
  save_on(1, *storage::open_storage(source));
  auto dst = storage::open_storage(unique_url("usage-dst"));
  ReshardOptions zero_ranks;
  zero_ranks.ranks = 0;
  EXPECT_THROW(reshard(source, *dst, zero_ranks), UsageError);
  ReshardOptions zero_budget;
  zero_budget.memory_budget_bytes = 0;
  EXPECT_THROW(reshard(source, *dst, zero_budget), UsageError);
  EXPECT_TRUE(dst->list("").empty());
  reshard(source, *dst, ReshardOptions{});
  EXPECT_THROW(reshard(source, *dst, ReshardOptions{}), UsageError);  // not empty now
  EXPECT_THROW(reshard(unique_url("nothing-here"), *storage::open_storage(unique_url("d")), ReshardOptions{}),
               StorageError);
}

}  // namespace
}  // namespace shardpoint::engine
