// save()/load() in one process: ThreadGroup ranks over MemoryStorage and LocalStorage,
// resharding N -> M, replicated data written once, read accounting, failure injection,
// corruption detection, and the on-disk result read back by the format/torchfile layers.
#include "shardpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "comm/thread_communicator.h"
#include "core/byte_stream.h"
#include "engine/checkpoint_index.h"
#include "engine/checkpoint_test_state.h"
#include "engine/checksum_sidecar.h"
#include "engine/flatten.h"
#include "format/metadata_codec.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/fault_injection_storage.h"
#include "storage/local_storage.h"
#include "storage/memory_storage.h"
#include "test_util.h"
#include "torchfile/torch_file.h"
#include "torchfile/torch_save_writer.h"

namespace shardpoint::engine {
namespace {

using namespace std::chrono_literals;
using testing::compare_with_expected;
using testing::make_rank_state;
using testing::RankState;

comm::CommOptions fast() { return comm::CommOptions{std::chrono::seconds(20)}; }

std::shared_ptr<storage::Storage> memory() { return storage::open_memory_storage(Location::parse("memory://"), {}); }

std::vector<SaveReport> save_on(int world, storage::Storage& st, SaveOptions options = {}) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, true));
  std::vector<SaveReport> reports(static_cast<std::size_t>(world));
  comm::ThreadGroup group(world, fast());
  group.run(
      [&](comm::Communicator& comm) { reports[comm.rank()] = save(states[comm.rank()].root, st, comm, options); });
  return reports;
}

// Loads on `world` ranks and checks every value; returns the reports.
// Every rank failed with an `ErrorType` whose message holds each of `needles`.
template <typename ErrorType>
void expect_every_rank_failed(const std::vector<std::exception_ptr>& errors, const std::vector<std::string>& needles) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not throw";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const ErrorType& e) {
      for (const std::string& needle : needles) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "rank " << r << ": " << e.what();
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": another kind of error: " << e.what();
    }
  }
}

std::vector<LoadReport> load_and_check(int world, storage::Storage& st, LoadOptions options = {}) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, false));
  std::vector<LoadReport> reports(static_cast<std::size_t>(world));
  comm::ThreadGroup group(world, fast());
  group.run(
      [&](comm::Communicator& comm) { reports[comm.rank()] = load(states[comm.rank()].root, st, comm, options); });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(compare_with_expected(states[r], r, world), "") << "rank " << r << " of " << world;
  }
  return reports;
}

// Bytes of the rank's tensor boxes plus the lengths of the bytes items (all ranks load
// every object).
std::uint64_t expected_needed(const format::Metadata& md, int rank, int world) {
  std::uint64_t n = 0;
  for (const auto& spec : testing::tensor_specs()) {
    n += static_cast<std::uint64_t>(volume(testing::box_of(spec, rank, world).sizes)) * dtype_itemsize(spec.dtype);
  }
  for (const auto& [index, info] : md.storage_data) {
    if (!index.offset) n += info.length;
  }
  return n;
}

TEST(CheckpointTest, ReshardsEveryWorldSizeOnMemoryStorage) {
  for (int n = 1; n <= 4; ++n) {
    auto st = memory();
    std::vector<SaveReport> saved = save_on(n, *st);
    const format::Metadata md = read_metadata(*st);
    // Every item is written exactly once: replicated tensors have one chunk and one blob.
    std::uint64_t written = 0, stored = 0;
    for (const auto& r : saved) written += r.bytes_written;
    for (const auto& [index, info] : md.storage_data) stored += info.length;
    EXPECT_EQ(written, stored) << n;
    for (const char* rep : {"model.rep", "model.scalar"}) {
      const auto& t = std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at(rep));
      EXPECT_EQ(t.chunks.size(), 1u) << rep;
    }
    EXPECT_EQ(std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at("model.w")).chunks.size(),
              static_cast<std::size_t>(n));
    for (int m = 1; m <= 4; ++m) {
      SCOPED_TRACE("save on " + std::to_string(n) + ", load on " + std::to_string(m));
      LoadOptions off;
      off.verify_checksums = false;
      std::vector<LoadReport> reports = load_and_check(m, *st, off);
      for (int r = 0; r < m; ++r) {
        EXPECT_EQ(reports[r].bytes_needed, expected_needed(md, r, m)) << "rank " << r;
        EXPECT_EQ(reports[r].data_bytes_read, reports[r].bytes_needed) << "rank " << r;
        // The load index says where each blob's data starts: unverified, no zip record is read.
        EXPECT_TRUE(reports[r].used_index) << "rank " << r;
        EXPECT_EQ(reports[r].bytes_read, reports[r].data_bytes_read) << "rank " << r;
      }
      std::vector<LoadReport> verified = load_and_check(m, *st);
      for (int r = 0; r < m; ++r) {
        EXPECT_GE(verified[r].data_bytes_read, verified[r].bytes_needed);
        EXPECT_EQ(verified[r].bytes_needed, reports[r].bytes_needed);
      }
    }
  }
}

TEST(CheckpointTest, ReshardsEveryWorldSizeOnLocalStorage) {
  shardpoint::testing::TempDir dir;
  for (int n = 1; n <= 4; ++n) {
    auto st = storage::open_local_storage_at(dir.file("n" + std::to_string(n)));
    SaveOptions options;
    options.durable = n == 2;  // one durable save; the rest fast
    options.thread_count = n == 3 ? 3 : 1;
    std::vector<SaveReport> saved = save_on(n, *st, options);
    EXPECT_EQ(saved[0].files.size(), static_cast<std::size_t>(options.thread_count));
    for (int m = 1; m <= 4; ++m) {
      SCOPED_TRACE("save on " + std::to_string(n) + ", load on " + std::to_string(m));
      LoadOptions lo;
      lo.thread_count = m;
      load_and_check(m, *st, lo);
    }
  }
}

std::string read_key(storage::Storage& st, std::string_view key) { return st.try_read_all(key).value(); }

// The load index holds what `.metadata`, the sidecar and each blob's zip records say.
TEST(LoadIndexTest, HoldsWhatMetadataSidecarAndBlobsSay) {
  auto st = memory();
  save_on(3, *st);
  const std::string metadata_bytes = read_key(*st, kMetadataKey);
  const std::string index_bytes = read_key(*st, kIndexKey);
  ASSERT_TRUE(index_matches(index_bytes, as_bytes(metadata_bytes)));
  const CheckpointIndex index = decode_checkpoint_index(index_bytes, "index");
  const format::Metadata md = format::decode_metadata(as_bytes(metadata_bytes), "md");
  EXPECT_EQ(index.metadata.state_dict_metadata, md.state_dict_metadata);
  EXPECT_EQ(index.metadata.key_order, md.key_order);
  EXPECT_EQ(index.metadata.planner_data, md.planner_data);
  EXPECT_EQ(index.metadata.storage_meta, md.storage_meta);
  EXPECT_EQ(index.metadata.version, md.version);
  ASSERT_EQ(index.metadata.storage_data.size(), md.storage_data.size());
  for (const auto& [key, info] : md.storage_data) {
    auto it = index.metadata.storage_data.find(key);
    ASSERT_NE(it, index.metadata.storage_data.end()) << key.fqn;
    EXPECT_EQ(it->first.index, key.index) << key.fqn;
    EXPECT_EQ(it->second, info) << key.fqn;
  }
  const ChecksumSidecar sidecar = ChecksumSidecar::decode(read_key(*st, kChecksumSidecar), "sidecar");
  ASSERT_TRUE(index.checksums);
  EXPECT_EQ(index.checksums->algorithm(), sidecar.algorithm());
  EXPECT_EQ(index.checksums->block_size(), sidecar.block_size());
  EXPECT_EQ(index.checksums->items(), sidecar.items());
  // Every tensor blob's data start, as its zip records and data.pkl give it.
  std::size_t tensors = 0;
  for (const auto& [key, info] : md.storage_data) {
    auto data = index.data_offsets.find(key);
    if (!key.offset) {
      EXPECT_EQ(data, index.data_offsets.end()) << "object " << key.fqn;
      continue;
    }
    ASSERT_NE(data, index.data_offsets.end()) << key.fqn;
    const std::string file = read_key(*st, info.relative_path);
    auto blob = torchfile::TorchFile::open(
        std::make_unique<MemorySource>(as_bytes(std::string_view(file).substr(info.offset, info.length)), key.fqn));
    EXPECT_EQ(data->second, blob->tensors()[0].storage.offset) << key.fqn;
    ++tensors;
  }
  EXPECT_GT(tensors, 3u);
}

// Loads plan from the index only when it matches the `.metadata` they read: a stale index
// (another `.metadata`), a damaged one or none at all and they parse `.metadata`, the
// sidecar and the blobs, with the same result.
TEST(LoadIndexTest, StaleDamagedOrMissingIndexIsNotUsed) {
  auto st = memory();
  save_on(2, *st);
  for (const LoadReport& r : load_and_check(3, *st)) EXPECT_TRUE(r.used_index);

  const std::string index_bytes = read_key(*st, kIndexKey);
  std::string damaged = index_bytes;
  damaged[damaged.size() / 2] = static_cast<char>(damaged[damaged.size() / 2] ^ 0x01);
  st->write_atomic(kIndexKey, as_bytes(damaged));
  for (const LoadReport& r : load_and_check(3, *st)) EXPECT_FALSE(r.used_index);

  // Another `.metadata` (as a later save by another tool would leave): here one tensor's
  // requires_grad flag differs, which a load does not use.
  st->write_atomic(kIndexKey, as_bytes(index_bytes));
  format::Metadata md = read_metadata(*st);
  std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at("model.w")).properties.requires_grad = true;
  st->write_atomic(kMetadataKey, as_bytes(format::encode_metadata(md)));
  std::vector<LoadReport> stale = load_and_check(3, *st);
  for (const LoadReport& r : stale) EXPECT_FALSE(r.used_index);

  st->remove(kIndexKey);
  LoadOptions unverified;
  unverified.verify_checksums = false;
  for (const LoadReport& r : load_and_check(3, *st, unverified)) {
    EXPECT_FALSE(r.used_index);
    EXPECT_GT(r.bytes_read, r.data_bytes_read) << "zip records and data.pkl are read to find the data";
  }
}

// An index that matches its `.metadata` but puts a blob's data past the blob's end is a
// format error naming the item, not a read outside the blob.
TEST(LoadIndexTest, DataStartPastTheBlobIsAFormatError) {
  auto st = memory();
  save_on(1, *st);
  const std::string metadata_bytes = read_key(*st, kMetadataKey);
  CheckpointIndex index = decode_checkpoint_index(read_key(*st, kIndexKey), "index");
  const format::MetadataIndex* victim = nullptr;
  for (auto& [key, start] : index.data_offsets) {
    if (key.fqn == "model.w") {
      start = index.metadata.storage_data.at(key).length;
      victim = &key;
    }
  }
  ASSERT_NE(victim, nullptr);
  st->write_atomic(kIndexKey, as_bytes(encode_checkpoint_index(index.metadata, as_bytes(metadata_bytes),
                                                               &*index.checksums, index.data_offsets)));
  RankState state = make_rank_state(0, 1, false);
  comm::ThreadGroup one(1, fast());
  try {
    one.run([&](comm::Communicator& comm) { load(state.root, *st, comm); });
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("\"model.w\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("past the blob"), std::string::npos) << e.what();
  }
}

TEST(LoadIndexTest, MalformedIndexesAreFormatErrors) {
  auto st = memory();
  save_on(1, *st);
  const std::string good = read_key(*st, kIndexKey);
  EXPECT_THROW(decode_checkpoint_index("", "idx"), FormatError);
  EXPECT_THROW(decode_checkpoint_index("not an index at all", "idx"), FormatError);
  for (std::size_t cut : {std::size_t{30}, good.size() / 3, good.size() - 5}) {
    EXPECT_THROW(decode_checkpoint_index(good.substr(0, cut) + "\0\0\0\0", "idx"), FormatError) << cut;
  }
  // A count of 2^32 - 1 entries is refused before anything is allocated for them.
  std::string huge = good;
  std::memset(huge.data() + 33, 0xff, 4);  // the state_dict_metadata count, after the 33-byte header
  try {
    decode_checkpoint_index(huge, "idx");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("idx: state_dict_metadata entries"), std::string::npos) << e.what();
  }
}

TEST(CheckpointTest, EmptyBucketsStillCreateFiles) {
  auto st = memory();
  SaveOptions options;
  options.thread_count = 4;
  std::vector<SaveReport> saved = save_on(4, *st, options);
  std::set<std::string> keys;
  for (const auto& o : st->list("")) keys.insert(o.key);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(saved[r].files.size(), 4u);
    for (int f = 0; f < 4; ++f) {
      const std::string name = "__" + std::to_string(r) + "_" + std::to_string(f) + ".distcp";
      EXPECT_TRUE(keys.contains(name)) << name;
      EXPECT_EQ(saved[r].files[f], name);
    }
  }
  EXPECT_TRUE(keys.contains(".metadata"));
  EXPECT_TRUE(keys.contains(kChecksumSidecar));
  load_and_check(3, *st);

  // Only replicated data, written by the lowest rank: rank 1 has nothing to write and
  // still creates its (empty) files.
  auto st2 = memory();
  std::vector<double> values{1.5, -2.25, 3.0};
  SaveOptions lowest;
  lowest.thread_count = 2;
  lowest.dedup_to_lowest_rank = true;
  comm::ThreadGroup group(2, fast());
  std::vector<SaveReport> reports(2);
  group.run([&](comm::Communicator& comm) {
    StateNode root(StateDict{});
    TensorShard t;
    t.dtype = DType::kFloat64;
    t.global_shape = {3};
    t.offsets = {0};
    t.sizes = {3};
    t.data = std::as_writable_bytes(std::span<double>(values));
    root.set("rep", StateNode(t));
    reports[comm.rank()] = save(root, *st2, comm, lowest);
  });
  EXPECT_EQ(reports[1].bytes_written, 0u);
  EXPECT_GT(reports[0].bytes_written, 0u);
  for (const char* name : {"__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp"}) {
    ASSERT_TRUE(st2->try_stat(name)) << name;
  }
  EXPECT_EQ(*st2->try_stat("__1_0.distcp"), 0u);
  EXPECT_EQ(*st2->try_stat("__1_1.distcp"), 0u);
  EXPECT_EQ(*st2->try_stat("__0_0.distcp") + *st2->try_stat("__0_1.distcp"), reports[0].bytes_written);
}

TEST(CheckpointTest, ItemsAreBackToBackTorchSaveBlobsBytesFirst) {
  shardpoint::testing::TempDir dir;
  auto st = storage::open_local_storage_at(dir.path().string());
  save_on(2, *st);
  const std::string metadata_bytes = shardpoint::testing::read_text(dir.file(".metadata"));
  const format::Metadata md = format::decode_metadata(as_bytes(metadata_bytes), ".metadata");
  EXPECT_TRUE(format::same_encoded_content(md, read_metadata(*st)));
  // Per file: blobs tile the file exactly, bytes items before tensors.
  std::map<std::string, std::vector<std::pair<format::StorageInfo, format::MetadataIndex>>> by_file;
  for (const auto& [index, info] : md.storage_data) by_file[info.relative_path].push_back({info, index});
  ASSERT_EQ(by_file.size(), 2u);
  for (auto& [file, items] : by_file) {
    std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first.offset < b.first.offset; });
    std::uint64_t pos = 0;
    bool seen_tensor = false;
    for (const auto& [info, index] : items) {
      EXPECT_EQ(info.offset, pos) << file << " " << index.fqn;
      pos += info.length;
      const bool is_tensor = index.offset.has_value();
      EXPECT_FALSE(seen_tensor && !is_tensor) << "bytes item after a tensor in " << file << ": " << index.fqn;
      seen_tensor = seen_tensor || is_tensor;
      // Every blob opens as a torch.save archive named "archive".
      auto whole = FileSource::open(dir.file(file));
      auto tf = torchfile::TorchFile::open(whole->window(info.offset, info.length, file));
      EXPECT_EQ(tf->archive_name(), "archive");
      if (is_tensor) {
        ASSERT_EQ(tf->tensors().size(), 1u);
        const auto& t = tf->tensors()[0];
        EXPECT_EQ(tf->tensor_of(*tf->root()), &t);
        EXPECT_TRUE(t.is_contiguous());
        EXPECT_EQ(t.storage_offset, 0);
        EXPECT_EQ(t.storage.size, t.nbytes());  // storage holds exactly the chunk
        const auto& tm = std::get<format::TensorStorageMetadata>(md.state_dict_metadata.at(index.fqn));
        EXPECT_EQ(t.dtype, tm.properties.dtype);
      } else {
        EXPECT_TRUE(tf->tensors().empty());
      }
    }
    EXPECT_EQ(pos, std::filesystem::file_size(dir.file(file))) << file;
  }
  // Objects are their pickle values.
  const auto& tag = md.storage_data.at(format::MetadataIndex{"tag", std::nullopt, std::nullopt});
  auto whole = FileSource::open(dir.file(tag.relative_path));
  auto tf = torchfile::TorchFile::open(whole->window(tag.offset, tag.length, "tag"));
  EXPECT_TRUE(pickle::deep_equal(*tf->root(), *pickle::Value::str("run-1")));
  // planner_data keeps the nesting.
  EXPECT_EQ(
      md.planner_data.at("optim.param_groups.0.lr"),
      (format::ObjectPath{std::string("optim"), std::string("param_groups"), std::int64_t{0}, std::string("lr")}));
  // The sidecar names every blob.
  const ChecksumSidecar sidecar =
      ChecksumSidecar::decode(shardpoint::testing::read_text(dir.file(kChecksumSidecar)), "sidecar");
  EXPECT_EQ(sidecar.size(), md.storage_data.size());
  for (const auto& [index, info] : md.storage_data) {
    const ItemChecksums* c = sidecar.find(info.relative_path, info.offset);
    ASSERT_NE(c, nullptr) << index.fqn;
    EXPECT_EQ(c->length, info.length);
    EXPECT_EQ(c->fqn, index.fqn);
    EXPECT_EQ(c->chunk_offsets, index.offset);
  }
}

TEST(CheckpointTest, VerifiedReshardingReadsOnlySlightlyMore) {
  // 1024 x 256 float32 (1 MiB) saved on one rank, loaded on 4: each needs 256 KiB.
  const Shape shape{1024, 256};
  std::vector<std::byte> full(1024 * 256 * 4);
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = static_cast<std::byte>((i * 7 + i / 4096) & 0xff);
  TensorShard t;
  t.global_shape = shape;
  t.offsets = {0, 0};
  t.sizes = shape;
  t.data = full;
  StateNode root(StateDict{});
  root.set("w", StateNode(t));
  auto st = memory();
  SaveOptions so;
  so.checksum_block_bytes = 64 << 10;
  so.checksum = ChecksumAlgorithm::kXxh3;
  comm::ThreadGroup one(1, fast());
  one.run([&](comm::Communicator& comm) { save(root, *st, comm, so); });

  for (bool verify : {false, true}) {
    std::vector<std::vector<std::byte>> got(4);
    std::vector<LoadReport> reports(4);
    comm::ThreadGroup four(4, fast());
    four.run([&](comm::Communicator& comm) {
      const int r = comm.rank();
      Box box = shard_box(shape, {2, 2}, {Placement::shard(0), Placement::shard(1)}, {r / 2, r % 2});
      got[r].assign(static_cast<std::size_t>(volume(box.sizes)) * 4, std::byte{0});
      TensorShard d;
      d.global_shape = shape;
      d.offsets = box.offsets;
      d.sizes = box.sizes;
      d.data = got[r];
      StateNode tmpl(StateDict{});
      tmpl.set("w", StateNode(d));
      LoadOptions lo;
      lo.verify_checksums = verify;
      reports[r] = load(tmpl, *st, comm, lo);
      // Exact values.
      for (std::int64_t row = 0; row < box.sizes[0]; ++row) {
        const std::size_t src = static_cast<std::size_t>(((box.offsets[0] + row) * 256 + box.offsets[1]) * 4);
        const std::size_t dst = static_cast<std::size_t>(row * box.sizes[1] * 4);
        ASSERT_EQ(std::memcmp(got[r].data() + dst, full.data() + src, static_cast<std::size_t>(box.sizes[1] * 4)), 0)
            << "rank " << r << " row " << row;
      }
    });
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(reports[r].bytes_needed, 256u << 10);
      if (!verify) {
        EXPECT_EQ(reports[r].data_bytes_read, reports[r].bytes_needed) << r;
      } else {
        // Dim-1 halves: every block holding a needed row is read whole (each row touches
        // the blocks of both halves), but never more than the blocks its rows span.
        EXPECT_GE(reports[r].data_bytes_read, reports[r].bytes_needed) << r;
        EXPECT_LE(reports[r].data_bytes_read, (512u << 10) + 2 * (64u << 10)) << r;
      }
      // Headers of the one blob: the zip reader scans the last 64 KiB + 22 bytes for the
      // end record (torchfile's EOCD search), plus local headers and data.pkl.
      EXPECT_LT(reports[r].bytes_read - reports[r].data_bytes_read, 70000u) << "headers, rank " << r;
    }
  }
  // Row halves (Shard(0) only): verified reads stay within two blocks of the need.
  std::vector<LoadReport> reports(4);
  comm::ThreadGroup four(4, fast());
  four.run([&](comm::Communicator& comm) {
    const int r = comm.rank();
    Box box = shard_box(shape, {4}, {Placement::shard(0)}, {r});
    std::vector<std::byte> buf(static_cast<std::size_t>(volume(box.sizes)) * 4);
    TensorShard d;
    d.global_shape = shape;
    d.offsets = box.offsets;
    d.sizes = box.sizes;
    d.data = buf;
    StateNode tmpl(StateDict{});
    tmpl.set("w", StateNode(d));
    reports[r] = load(tmpl, *st, comm);
    ASSERT_EQ(std::memcmp(buf.data(), full.data() + box.offsets[0] * 256 * 4, buf.size()), 0);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_LE(reports[r].data_bytes_read, reports[r].bytes_needed + 2 * (64u << 10)) << r;
  }
}

// A 1024 x `cols` float32 tensor "w" (row i, column j holds i * cols + j) saved on 4 ranks
// (Shard(0), 256 KiB each with the default 256 columns) with crc32c in `block_bytes`
// blocks, which the reshard boundaries cut.
struct BlockTestCheckpoint {
  shardpoint::testing::TempDir dir;
  std::shared_ptr<storage::Storage> st;
  const std::int64_t cols;
  std::vector<float> full;

  explicit BlockTestCheckpoint(std::int64_t columns = 256, std::uint64_t block_bytes = 64 << 10)
      : cols(columns), full(static_cast<std::size_t>(1024 * columns)) {
    for (std::size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
    st = storage::open_local_storage_at(dir.path().string());
    SaveOptions so;
    so.checksum_block_bytes = block_bytes;
    comm::ThreadGroup four(4, fast());
    four.run([&](comm::Communicator& comm) {
      const int r = comm.rank();
      TensorShard t;
      t.global_shape = {1024, cols};
      t.offsets = {r * 256, 0};
      t.sizes = {256, cols};
      t.data = std::as_writable_bytes(std::span<float>(full).subspan(static_cast<std::size_t>(r * 256 * cols),
                                                                     static_cast<std::size_t>(256 * cols)));
      StateNode root(StateDict{});
      root.set("w", StateNode(t));
      save(root, *st, comm, so);
    });
  }

  // Flips one bit of the saved element (row, col).
  void corrupt(std::int64_t row, std::int64_t col) {
    const format::Metadata md = read_metadata(*st);
    const auto& info = md.storage_data.at(format::MetadataIndex{"w", Shape{row / 256 * 256, 0}, std::nullopt});
    auto whole = FileSource::open(dir.file(info.relative_path));
    auto tf = torchfile::TorchFile::open(whole->window(info.offset, info.length, "w"));
    const std::uint64_t at =
        info.offset + tf->tensors()[0].storage.offset + static_cast<std::uint64_t>((row % 256) * cols + col) * 4;
    std::fstream f(dir.file(info.relative_path), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
  }

  // Loads rows [row0, row0 + rows) on each rank (boxes[r]); returns reports and errors.
  std::vector<std::exception_ptr> load_rows(const std::vector<std::pair<std::int64_t, std::int64_t>>& boxes,
                                            std::vector<LoadReport>& reports) {
    const int world = static_cast<int>(boxes.size());
    reports.assign(boxes.size(), LoadReport{});
    comm::ThreadGroup group(world, fast());
    return group.run_all([&](comm::Communicator& comm) {
      const int r = comm.rank();
      const auto [row0, rows] = boxes[static_cast<std::size_t>(r)];
      std::vector<float> got(static_cast<std::size_t>(rows * cols), -1.0f);
      TensorShard d;
      d.global_shape = {1024, cols};
      d.offsets = {row0, 0};
      d.sizes = {rows, cols};
      d.data = std::as_writable_bytes(std::span<float>(got));
      StateNode tmpl(StateDict{});
      tmpl.set("w", StateNode(d));
      reports[r] = load(tmpl, *st, comm);
      EXPECT_EQ(std::memcmp(got.data(), full.data() + row0 * cols, got.size() * 4), 0) << "rank " << r;
    });
  }
};

std::vector<std::pair<std::int64_t, std::int64_t>> three_way() { return {{0, 342}, {342, 342}, {684, 340}}; }

// Blocks cut by the 4 -> 3 boundaries are verified by combining the crc32c of the pieces
// the ranks read (no rank reads bytes it does not need), and still catch a flipped bit.
TEST(CheckpointTest, VerifiedReshardReadsEachNeededByteOnce) {
  BlockTestCheckpoint ck;
  std::vector<LoadReport> reports;
  for (const auto& e : ck.load_rows(three_way(), reports)) EXPECT_FALSE(e);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(reports[r].bytes_needed, static_cast<std::uint64_t>(three_way()[r].second) * 256 * 4) << r;
    // Not one byte more (widening to the 64 KiB blocks would add up to 128 KiB per blob;
    // the zip records sharing a blob's first and last blocks come from the parser's reads).
    EXPECT_EQ(reports[r].data_bytes_read, reports[r].bytes_needed) << "rank " << r;
  }
  // Row 341 (rank 0's last) shares a checksum block with row 342 (rank 1's first).
  ck.corrupt(341, 255);
  expect_every_rank_failed<FormatError>(ck.load_rows(three_way(), reports),
                                        {"__1_0.distcp", "\"w\"", "checksum mismatch in block", "expected crc32c"});
}

// With 1 MiB blocks over 1 MiB blobs, the pieces a rank reads of a block are larger than
// one verified read (256 KiB): their crc32c is taken read by read and still combines to
// the block's, and a flipped bit inside a long piece is found.
TEST(CheckpointTest, VerifiedReshardCombinesPiecesReadInSeveralReads) {
  BlockTestCheckpoint ck(/*columns=*/1024, /*block_bytes=*/1 << 20);
  std::vector<LoadReport> reports;
  for (const auto& e : ck.load_rows(three_way(), reports)) EXPECT_FALSE(e);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(reports[r].data_bytes_read, reports[r].bytes_needed) << "rank " << r;
  // Rank 0 reads rows 256..341 of the second blob: 344 KiB of its first block.
  ck.corrupt(300, 7);
  expect_every_rank_failed<FormatError>(ck.load_rows(three_way(), reports),
                                        {"checksum mismatch in block 0", "__1_0.distcp"});
}

// A box no other rank completes: the rest of its boundary blocks is read (and checked).
TEST(CheckpointTest, VerifiedPartialLoadReadsTheRestOfBoundaryBlocks) {
  BlockTestCheckpoint ck;
  std::vector<LoadReport> reports;
  for (const auto& e : ck.load_rows({{100, 200}}, reports)) EXPECT_FALSE(e);
  EXPECT_EQ(reports[0].bytes_needed, 200u * 256 * 4);
  EXPECT_GT(reports[0].data_bytes_read, reports[0].bytes_needed);
  EXPECT_LE(reports[0].data_bytes_read, reports[0].bytes_needed + 2 * (64u << 10));
  // Row 99 is not needed but shares a block with row 100: the flip is found.
  ck.corrupt(99, 255);
  auto errors = ck.load_rows({{100, 200}}, reports);
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch in block"), std::string::npos) << e.what();
  }
  // Rows 100.. alone, unverified, are intact.
  LoadOptions off;
  off.verify_checksums = false;
  std::vector<float> got(200 * 256);
  TensorShard d;
  d.global_shape = {1024, 256};
  d.offsets = {100, 0};
  d.sizes = {200, 256};
  d.data = std::as_writable_bytes(std::span<float>(got));
  StateNode tmpl(StateDict{});
  tmpl.set("w", StateNode(d));
  comm::ThreadGroup one(1, fast());
  one.run([&](comm::Communicator& comm) { load(tmpl, *ck.st, comm, off); });
  EXPECT_EQ(std::memcmp(got.data(), ck.full.data() + 100 * 256, got.size() * 4), 0);
}

std::vector<std::exception_ptr> save_all(int world, storage::Storage& st) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, true));
  comm::ThreadGroup group(world, fast());
  return group.run_all([&](comm::Communicator& comm) { save(states[comm.rank()].root, st, comm); });
}

TEST(CheckpointFailureTest, OneRankWriteFailsEveryRankThrowsNothingCommitted) {
  for (storage::FaultOp op : {storage::FaultOp::kWrite, storage::FaultOp::kCommit, storage::FaultOp::kOpenWriter}) {
    std::shared_ptr<storage::Storage> previous = memory();
    save_on(2, *previous);
    auto target = memory();
    storage::FaultInjectionStorage faulty(target);
    faulty.fail(storage::FaultRule{op, 1, StorageError::Kind::kNoSpace, "__1_0"});
    const auto errors = save_all(3, faulty);
    expect_every_rank_failed<StorageError>(errors, {"save failed on rank 1 (of 3): rank 1: "});
    EXPECT_EQ(faulty.injected(), 1u);
    EXPECT_FALSE(target->try_stat(".metadata"));
    EXPECT_FALSE(target->try_stat(kChecksumSidecar));
    EXPECT_TRUE(target->list("").empty()) << "files of the failed attempt are removed";
    EXPECT_THROW(read_metadata(*target), StorageError);
    load_and_check(2, *previous);  // another checkpoint is untouched
  }
}

TEST(CheckpointFailureTest, MetadataWriteFailsNothingCommitted) {
  shardpoint::testing::TempDir dir;
  std::shared_ptr<storage::Storage> previous = storage::open_local_storage_at(dir.file("prev"));
  save_on(2, *previous);
  std::shared_ptr<storage::Storage> target = storage::open_local_storage_at(dir.file("next"));
  storage::FaultInjectionStorage faulty(target);
  faulty.fail(storage::FaultRule{storage::FaultOp::kWriteAtomic, 1, StorageError::Kind::kPermission, ".metadata"});
  expect_every_rank_failed<StorageError>(save_all(2, faulty), {"save failed on rank 0 (of 2): rank 0: "});
  EXPECT_FALSE(target->try_stat(".metadata"));
  EXPECT_FALSE(target->try_stat(kChecksumSidecar));
  EXPECT_TRUE(target->list("").empty());
  load_and_check(3, *previous);
}

TEST(CheckpointFailureTest, SeveralRanksFailAllNamed) {
  auto target = memory();
  storage::FaultInjectionStorage faulty(target);
  faulty.fail(storage::FaultRule{storage::FaultOp::kCommit, 1, StorageError::Kind::kTransient, "__1_"});
  faulty.fail(storage::FaultRule{storage::FaultOp::kCommit, 1, StorageError::Kind::kTransient, "__3_"});
  expect_every_rank_failed<StorageError>(save_all(4, faulty),
                                         {"save failed on ranks 1, 3 (of 4): rank 1: ", "; rank 3: "});
  EXPECT_TRUE(target->list("").empty());
}

TEST(CheckpointFailureTest, InvalidStateOnOneRankFailsEveryRank) {
  auto st = memory();
  std::vector<RankState> states;
  for (int r = 0; r < 2; ++r) states.push_back(make_rank_state(r, 2, true));
  // Rank 1 disagrees on model.w's dtype.
  StateNode* w = states[1].root.find("model")->find("w");
  w->tensor().dtype = DType::kInt32;
  comm::ThreadGroup group(2, fast());
  expect_every_rank_failed<PlanError>(
      group.run_all([&](comm::Communicator& comm) { save(states[comm.rank()].root, *st, comm); }), {"model.w"});
  EXPECT_TRUE(st->list("").empty());
}

TEST(CheckpointFailureTest, CorruptedByteIsACheckumErrorNamingFileAndFqn) {
  shardpoint::testing::TempDir dir;
  auto st = storage::open_local_storage_at(dir.path().string());
  save_on(2, *st);
  const format::Metadata md = read_metadata(*st);
  const auto& info = md.storage_data.at(format::MetadataIndex{"model.w", Shape{0, 0}, std::nullopt});
  {
    auto whole = FileSource::open(dir.file(info.relative_path));
    auto tf = torchfile::TorchFile::open(whole->window(info.offset, info.length, "w"));
    const std::uint64_t at = info.offset + tf->tensors()[0].storage.offset + 5;
    std::fstream f(dir.file(info.relative_path), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
  }
  for (int world : {1, 2, 3}) {
    std::vector<RankState> states;
    for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, false));
    comm::ThreadGroup group(world, fast());
    expect_every_rank_failed<FormatError>(
        group.run_all([&](comm::Communicator& comm) { load(states[comm.rank()].root, *st, comm); }),
        {info.relative_path, "\"model.w\"", "checksum mismatch", "expected crc32c", "load failed on rank"});
  }
  // Verification off: loads (the flipped byte arrives as is).
  std::vector<RankState> states;
  states.push_back(make_rank_state(0, 1, false));
  comm::ThreadGroup group(1, fast());
  LoadOptions off;
  off.verify_checksums = false;
  group.run([&](comm::Communicator& comm) { load(states[0].root, *st, comm, off); });
  EXPECT_NE(compare_with_expected(states[0], 0, 1).find("model.w: bytes differ at 5"), std::string::npos);
}

TEST(CheckpointLoadTest, MissingMetadataIsNotACommittedCheckpoint) {
  auto st = memory();
  try {
    read_metadata(*st);
    FAIL() << "no error";
  } catch (const StorageError& e) {
    EXPECT_EQ(e.kind(), StorageError::Kind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("not a committed checkpoint (no .metadata)"), std::string::npos);
  }
  std::vector<RankState> states;
  for (int r = 0; r < 2; ++r) states.push_back(make_rank_state(r, 2, false));
  comm::ThreadGroup group(2, fast());
  expect_every_rank_failed<StorageError>(
      group.run_all([&](comm::Communicator& comm) { load(states[comm.rank()].root, *st, comm); }),
      {"load failed on rank 0 (of 2): rank 0: ", "not a committed checkpoint"});
}

TEST(CheckpointLoadTest, StrictAndNonStrictMissingKeys) {
  auto st = memory();
  save_on(2, *st);
  auto make_template = [](int r, int world) {
    RankState s = make_rank_state(r, world, false);
    s.put("extra", StateNode(pickle::Value::none()));
    // model.w asked for as bfloat16: a dtype mismatch.
    s.root.find("model")->find("w")->tensor().dtype = DType::kBFloat16;
    return s;
  };
  {
    std::vector<RankState> states;
    for (int r = 0; r < 2; ++r) states.push_back(make_template(r, 2));
    comm::ThreadGroup group(2, fast());
    expect_every_rank_failed<PlanError>(
        group.run_all([&](comm::Communicator& comm) { load(states[comm.rank()].root, *st, comm); }),
        {"extra", "model.w"});
  }
  std::vector<RankState> states;
  for (int r = 0; r < 2; ++r) states.push_back(make_template(r, 2));
  std::vector<LoadReport> reports(2);
  comm::ThreadGroup group(2, fast());
  LoadOptions lax;
  lax.strict = false;
  group.run([&](comm::Communicator& comm) { reports[comm.rank()] = load(states[comm.rank()].root, *st, comm, lax); });
  for (int r = 0; r < 2; ++r) {
    std::set<std::string> kinds;
    for (const auto& p : reports[r].problems) kinds.insert(p.fqn + ":" + std::to_string(static_cast<int>(p.kind)));
    EXPECT_TRUE(kinds.contains("extra:" + std::to_string(static_cast<int>(LoadProblem::Kind::kMissingKey))));
    EXPECT_TRUE(kinds.contains("model.w:" + std::to_string(static_cast<int>(LoadProblem::Kind::kDTypeMismatch))));
    // Everything else loaded exactly.
    const RankState want = make_rank_state(r, 2, true);
    EXPECT_EQ(*states[r].buffers[1], *want.buffers[1]);
    EXPECT_EQ(*states[r].buffers[2], *want.buffers[2]);
  }
}

TEST(CheckpointLoadTest, Dcp23KeysFallBackToTheOldFlattening) {
  // Saved with a 2.3-era layout: the all-scalar dict "cfg" is one bytes item "cfg".
  auto st = memory();
  {
    StateNode root(StateDict{});
    root.set("cfg", StateNode(pickle::Value::dict({{pickle::Value::str("a"), pickle::Value::integer(1)},
                                                   {pickle::Value::str("b"), pickle::Value::str("x")}})));
    comm::ThreadGroup one(1, fast());
    one.run([&](comm::Communicator& comm) { save(root, *st, comm); });
  }
  // The template has it as a nested dict of objects (2.4 flattening: cfg.a, cfg.b).
  StateNode tmpl(StateDict{});
  StateDict cfg;
  cfg.emplace_back("a", StateNode(pickle::Value::none()));
  cfg.emplace_back("b", StateNode(pickle::Value::none()));
  tmpl.set("cfg", StateNode(std::move(cfg)));
  comm::ThreadGroup one(1, fast());
  one.run([&](comm::Communicator& comm) { load(tmpl, *st, comm); });
  const StateNode* got = tmpl.find("cfg");
  ASSERT_NE(got, nullptr);
  ASSERT_TRUE(got->is_object());
  EXPECT_TRUE(
      pickle::deep_equal(*got->object(), *pickle::Value::dict({{pickle::Value::str("a"), pickle::Value::integer(1)},
                                                               {pickle::Value::str("b"), pickle::Value::str("x")}})));
}

TEST(CheckpointLoadTest, SavedLayoutsOtherThanRowMajorLoadCorrectly) {
  // A hand-made checkpoint as PyTorch may write it: "t" saved with permuted strides
  // (column-major [4, 6], docs/dcp-format.md §2.3), "u" as a view at storage offset 2 of a 5-element
  // storage. No sidecar: nothing to verify.
  auto tensor_blob = [](const Shape& shape, const Shape& strides, std::int64_t storage_offset,
                        const std::vector<float>& storage) {
    StringSink sink;
    torchfile::TorchSaveWriter writer(sink);
    writer.write_pickle(
        *torchfile::make_tensor_node(DType::kFloat32, shape, strides, storage_offset, "0", storage.size()));
    writer.write_storage("0", std::as_bytes(std::span<const float>(storage)));
    writer.finish();
    return sink.take();
  };
  std::vector<float> column_major(24);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 6; ++j) column_major[static_cast<std::size_t>(i + 4 * j)] = static_cast<float>(i * 6 + j);
  }
  const std::string t = tensor_blob({4, 6}, {1, 4}, 0, column_major);
  const std::string u = tensor_blob({3}, {1}, 2, {9, 9, 10.5f, 11.5f, 12.5f});
  format::Metadata md;
  format::TensorStorageMetadata tm;
  tm.size = {4, 6};
  tm.chunks = {format::ChunkStorageMetadata{{0, 0}, {4, 6}}};
  md.state_dict_metadata["t"] = tm;
  format::TensorStorageMetadata um;
  um.size = {3};
  um.chunks = {format::ChunkStorageMetadata{{0}, {3}}};
  md.state_dict_metadata["u"] = um;
  md.storage_data[format::MetadataIndex{"t", Shape{0, 0}, 0}] = format::StorageInfo{"__0_0.distcp", 0, t.size(), {}};
  md.storage_data[format::MetadataIndex{"u", Shape{0}, 0}] =
      format::StorageInfo{"__0_0.distcp", t.size(), u.size(), {}};
  auto st = memory();
  st->write_atomic("__0_0.distcp", as_bytes(t + u));
  st->write_atomic(".metadata", as_bytes(format::encode_metadata(md)));

  comm::ThreadGroup group(2, fast());
  group.run([&](comm::Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> tbuf(12, -1), ubuf(3, -1);
    TensorShard ts;
    ts.global_shape = {4, 6};
    ts.offsets = {0, 3 * r};
    ts.sizes = {4, 3};
    ts.data = std::as_writable_bytes(std::span<float>(tbuf));
    TensorShard us;
    us.global_shape = {3};
    us.offsets = {0};
    us.sizes = {3};
    us.data = std::as_writable_bytes(std::span<float>(ubuf));
    StateNode root(StateDict{});
    root.set("t", StateNode(ts));
    root.set("u", StateNode(us));
    const LoadReport report = load(root, *st, comm);
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 3; ++j) {
        EXPECT_EQ(tbuf[static_cast<std::size_t>(i * 3 + j)], static_cast<float>(i * 6 + 3 * r + j))
            << r << " " << i << " " << j;
      }
    }
    EXPECT_EQ(ubuf, (std::vector<float>{10.5f, 11.5f, 12.5f}));
    EXPECT_EQ(report.bytes_needed, (12u + 3u) * 4u);
  });
}

TEST(CheckpointTorchTest, Torch113LoadsBlobsCutFromADistcpFile) {
  SP_REQUIRE_TORCH113(python);
  shardpoint::testing::TempDir dir;
  auto st = storage::open_local_storage_at(dir.file("ckpt"));
  save_on(2, *st);
  const format::Metadata md = read_metadata(*st);
  auto cut = [&](const format::MetadataIndex& index, const std::string& out) {
    const auto& info = md.storage_data.at(index);
    const std::string file = shardpoint::testing::read_text(dir.file("ckpt/" + info.relative_path));
    shardpoint::testing::write_text(out, file.substr(info.offset, info.length));
  };
  cut({"model.w", Shape{5, 0}, std::nullopt}, dir.file("w.pt"));
  cut({"tag", std::nullopt, std::nullopt}, dir.file("tag.pt"));
  cut({"optim.param_groups.0.params", std::nullopt, std::nullopt}, dir.file("params.pt"));
  cut({"model.scalar", Shape{}, std::nullopt}, dir.file("scalar.pt"));
  const std::string script = "import torch\n"
                             "w = torch.load('" +
                             dir.file("w.pt") +
                             "', weights_only=True)\n"
                             "print(w.dtype, list(w.shape), w.flatten().tolist())\n"
                             "print(repr(torch.load('" +
                             dir.file("tag.pt") +
                             "', weights_only=True)))\n"
                             "print(repr(torch.load('" +
                             dir.file("params.pt") +
                             "', weights_only=True)))\n"
                             "s = torch.load('" +
                             dir.file("scalar.pt") +
                             "', weights_only=True)\n"
                             "print(s.dtype, list(s.shape), s.item())\n";
  shardpoint::testing::write_text(dir.file("check.py"), script);
  const auto result = shardpoint::testing::run_command(python + " " + dir.file("check.py") + " 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // Rows 5..9 of model.w: element i holds i * 0.5 + 1.
  std::string want = "torch.float32 [5, 3] [";
  for (int i = 15; i < 30; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.1f", i == 15 ? "" : ", ", i * 0.5 + 1);
    want += buf;
  }
  want += "]\n'run-1'\n[0, 1]\ntorch.float32 [] 42.25\n";
  EXPECT_EQ(result.output, want);
}

}  // namespace
}  // namespace shardpoint::engine
