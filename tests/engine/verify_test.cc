// verify() in one process: checkpoints saved by ThreadGroup ranks into MemoryStorage (with
// and without the checksum sidecar) and torch.save files in a temporary folder, then damaged
// on purpose: a byte of tensor data, of data.pkl, of a zip header, a truncated file, a
// swapped pair of equal-size blobs. Each problem names the file and the item; an undamaged
// checkpoint passes; records whose writer stored no CRC-32 are "no checksum", never
// verified and never a problem; --quick reads no tensor data.
#include "shardpoint/verify.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "comm/thread_communicator.h"
#include "core/byte_stream.h"
#include "engine/checkpoint_test_state.h"
#include "engine/torch_save.h"
#include "format/metadata_codec.h"
#include "shardpoint/checkpoint.h"
#include "storage/local_storage.h"
#include "storage/memory_storage.h"
#include "test_util.h"
#include "torchfile/zip_format.h"
#include "torchfile/zip_reader.h"

namespace shardpoint::engine {
namespace {

using shardpoint::testing::TempDir;

std::shared_ptr<storage::Storage> memory() { return storage::open_memory_storage(Location::parse("memory://"), {}); }

void save_on(int world, storage::Storage& st, SaveOptions options = {}) {
  std::vector<testing::RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(testing::make_rank_state(r, world, true));
  comm::ThreadGroup group(world, comm::CommOptions{std::chrono::seconds(20)});
  group.run([&](comm::Communicator& comm) { save(states[comm.rank()].root, st, comm, options); });
}

SaveOptions no_sidecar() {
  SaveOptions o;
  o.checksum = ChecksumAlgorithm::kNone;
  return o;
}

std::string read_all(storage::Storage& st, const std::string& key) { return st.try_read_all(key).value(); }
void write_all(storage::Storage& st, const std::string& key, const std::string& bytes) {
  st.write_atomic(key, as_bytes(bytes));
}

// The blob of fqn's chunk at `offsets` (nullopt: an object).
format::StorageInfo blob_of(storage::Storage& st, const std::string& fqn, std::optional<format::Shape> offsets) {
  const format::Metadata md = read_metadata(st);
  return md.storage_data.at(format::MetadataIndex{fqn, std::move(offsets), std::nullopt});
}

// The record "<archive>/<suffix>" of a blob (offsets relative to the blob).
torchfile::ZipEntry record_of(storage::Storage& st, const format::StorageInfo& info, const std::string& suffix) {
  const std::string file = read_all(st, info.relative_path);
  const std::string blob = file.substr(static_cast<std::size_t>(info.offset), static_cast<std::size_t>(info.length));
  MemorySource source(as_bytes(blob), "blob");
  torchfile::ZipArchive archive(source);
  for (const auto& e : archive.entries()) {
    if (e.name.ends_with("/" + suffix)) return e;
  }
  ADD_FAILURE() << "no record " << suffix;
  return {};
}

void flip(storage::Storage& st, const std::string& key, std::uint64_t at) {
  std::string bytes = read_all(st, key);
  bytes[static_cast<std::size_t>(at)] ^= 0x41;
  write_all(st, key, bytes);
}

VerifyReport check(const std::shared_ptr<storage::Storage>& st, VerifyOptions options = {}) {
  return verify_dcp(st, std::nullopt, "ckpt", options);
}

std::string all_messages(const VerifyReport& r) {
  std::string out;
  for (const auto& p : r.problems) out += p.message + "\n";
  return out;
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

const format::Shape kW0{0, 0};  // model.w's first chunk (rows 0..4 of 2 ranks)

TEST(VerifyTest, UndamagedCheckpointWithSidecarPasses) {
  auto st = memory();
  save_on(2, *st);
  VerifyReport r = check(st);
  EXPECT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.kind, CheckpointKind::kDcp);
  EXPECT_EQ(r.tensors, 6u);
  std::uint64_t objects = 0;
  for (const auto& [fqn, e] : read_metadata(*st).state_dict_metadata)
    objects += std::holds_alternative<format::BytesStorageMetadata>(e);
  EXPECT_EQ(r.objects, objects);
  EXPECT_GT(r.bytes, 0u);
  EXPECT_EQ(r.verified_bytes, r.bytes);
  ASSERT_EQ(r.coverage.size(), 1u);
  const VerifyCoverage& c = r.coverage[0];
  EXPECT_EQ(c.sidecar, ChecksumAlgorithm::kCrc32c);
  EXPECT_GE(c.sidecar_bytes, r.bytes);
  EXPECT_GT(c.records, 0u);
  EXPECT_EQ(c.zip_crc32_records, c.records);  // the second check: every record's zip CRC-32
  EXPECT_EQ(c.zip_crc32_bytes, c.record_bytes);
  EXPECT_EQ(c.no_checksum_records, 0u);
}

TEST(VerifyTest, UndamagedCheckpointWithoutSidecarIsCoveredByZipCrc) {
  auto st = memory();
  save_on(2, *st, no_sidecar());
  ASSERT_FALSE(st->try_stat(kChecksumSidecar));
  VerifyReport r = check(st);
  EXPECT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.verified_bytes, r.bytes);
  EXPECT_EQ(r.coverage[0].sidecar, ChecksumAlgorithm::kNone);
  EXPECT_EQ(r.coverage[0].sidecar_bytes, 0u);
  EXPECT_EQ(r.coverage[0].zip_crc32_records, r.coverage[0].records);
}

TEST(VerifyTest, QuickReadsNoTensorDataAndVerifiesNothing) {
  auto st = memory();
  save_on(2, *st, no_sidecar());
  const format::StorageInfo w = blob_of(*st, "model.w", kW0);
  flip(*st, w.relative_path, w.offset + record_of(*st, w, "data/0").data_offset);
  VerifyOptions quick;
  quick.quick = true;
  VerifyReport r = check(st, quick);
  EXPECT_TRUE(r.ok()) << all_messages(r);  // data is not read
  EXPECT_EQ(r.tensors, 6u);
  EXPECT_EQ(r.bytes, 0u);
  EXPECT_EQ(r.verified_bytes, 0u);
  EXPECT_TRUE(r.coverage[0].quick);
  EXPECT_EQ(r.coverage[0].zip_crc32_records, 0u);
  EXPECT_GT(r.coverage[0].bytes, 0u);
  EXPECT_FALSE(check(st).ok());
}

TEST(VerifyTest, FlippedTensorDataWithoutSidecarFailsItsZipCrc) {
  auto st = memory();
  save_on(2, *st, no_sidecar());
  const format::StorageInfo w = blob_of(*st, "model.w", kW0);
  const torchfile::ZipEntry data = record_of(*st, w, "data/0");
  flip(*st, w.relative_path, w.offset + data.data_offset + 5);
  VerifyReport r = check(st);
  ASSERT_EQ(r.problems.size(), 1u) << all_messages(r);
  const VerifyProblem& p = r.problems[0];
  EXPECT_EQ(p.file, w.relative_path);
  EXPECT_EQ(p.item, "model.w chunk [0:5, 0:3]");
  const std::string begin = std::to_string(w.offset + data.data_offset);
  const std::string end = std::to_string(w.offset + data.data_offset + data.uncompressed_size);
  EXPECT_EQ(
      p.message.rfind(w.relative_path + ": item \"model.w\" chunk [0:5, 0:3]: zip record \"archive/data/0\", bytes [" +
                          begin + ", " + end + ") of the file: expected CRC-32 ",
                      0),
      0u)
      << p.message;
  EXPECT_EQ(r.tensors, 5u);
}

TEST(VerifyTest, FlippedTensorDataWithSidecarIsOneProblem) {
  auto st = memory();
  save_on(2, *st);
  const format::StorageInfo w = blob_of(*st, "model.w", kW0);
  flip(*st, w.relative_path, w.offset + record_of(*st, w, "data/0").data_offset + 5);
  VerifyReport r = check(st);
  ASSERT_EQ(r.problems.size(), 1u) << all_messages(r);  // the zip CRC-32 of a failed blob is not checked again
  EXPECT_TRUE(contains(r.problems[0].message, "checksum mismatch")) << r.problems[0].message;
  EXPECT_TRUE(contains(r.problems[0].message, w.relative_path)) << r.problems[0].message;
  EXPECT_TRUE(contains(r.problems[0].message, "model.w")) << r.problems[0].message;
}

// A flip inside a string of data.pkl (the storage location "cpu") still parses: only the
// zip CRC-32 of data.pkl finds it.
TEST(VerifyTest, FlippedDataPklFailsItsZipCrc) {
  auto st = memory();
  save_on(2, *st, no_sidecar());
  const format::StorageInfo w = blob_of(*st, "model.w", kW0);
  const torchfile::ZipEntry pkl = record_of(*st, w, "data.pkl");
  const std::string file = read_all(*st, w.relative_path);
  const std::size_t cpu = file.find("cpu", static_cast<std::size_t>(w.offset + pkl.data_offset));
  ASSERT_LT(cpu, w.offset + pkl.data_offset + pkl.uncompressed_size);
  flip(*st, w.relative_path, cpu + 2);
  VerifyReport r = check(st);
  ASSERT_EQ(r.problems.size(), 1u) << all_messages(r);
  EXPECT_EQ(r.problems[0].file, w.relative_path);
  EXPECT_EQ(r.problems[0].item, "model.w chunk [0:5, 0:3]");
  EXPECT_TRUE(contains(r.problems[0].message, "zip record \"archive/data.pkl\"")) << r.problems[0].message;
  EXPECT_TRUE(contains(r.problems[0].message, "expected CRC-32")) << r.problems[0].message;
}

// The local header's CRC field (0: the CRC follows the data) is no record's data: the header
// check finds it.
TEST(VerifyTest, FlippedZipHeaderIsFound) {
  auto st = memory();
  save_on(2, *st, no_sidecar());
  const format::StorageInfo w = blob_of(*st, "model.w", kW0);
  const torchfile::ZipEntry data = record_of(*st, w, "data/0");
  flip(*st, w.relative_path, w.offset + data.local_header_offset + 14);
  VerifyReport r = check(st);
  ASSERT_EQ(r.problems.size(), 1u) << all_messages(r);
  EXPECT_EQ(r.problems[0].file, w.relative_path);
  EXPECT_EQ(r.problems[0].item, "model.w chunk [0:5, 0:3]");
  EXPECT_TRUE(contains(r.problems[0].message, "zip local header of \"archive/data/0\"")) << r.problems[0].message;
  EXPECT_TRUE(contains(r.problems[0].message, "expected CRC-32")) << r.problems[0].message;
}

// A flip in a header the parser needs (the signature) is a structure problem, named the same way.
TEST(VerifyTest, BrokenZipSignatureIsFound) {
  auto st = memory();
  save_on(2, *st, no_sidecar());
  const format::StorageInfo w = blob_of(*st, "model.w", kW0);
  flip(*st, w.relative_path, w.offset + record_of(*st, w, "data/0").local_header_offset);
  VerifyReport r = check(st);
  ASSERT_EQ(r.problems.size(), 1u) << all_messages(r);
  EXPECT_EQ(r.problems[0].file, w.relative_path);
  EXPECT_TRUE(contains(r.problems[0].message, w.relative_path)) << r.problems[0].message;
  EXPECT_TRUE(contains(r.problems[0].message, "model.w")) << r.problems[0].message;
}

TEST(VerifyTest, TruncatedFileIsFound) {
  auto st = memory();
  save_on(2, *st, no_sidecar());
  const format::StorageInfo w = blob_of(*st, "model.w", kW0);
  std::string file = read_all(*st, w.relative_path);
  write_all(*st, w.relative_path, file.substr(0, file.size() - 100));
  VerifyReport r = check(st);
  ASSERT_FALSE(r.ok());
  bool named = false;
  for (const auto& p : r.problems) {
    EXPECT_EQ(p.file, w.relative_path) << p.message;
    named |= contains(p.message, "truncated") && contains(p.message, w.relative_path) && !p.item.empty() &&
             contains(p.message, p.item);
  }
  EXPECT_TRUE(named) << all_messages(r);
}

// Two chunks of the same shape and dtype, swapped between the files: each blob is a valid
// archive whose CRC-32s match, so only the sidecar, which ties each blob to its place, finds
// the swap. Without a sidecar nothing in the blobs can (documented in verify.h's coverage).
TEST(VerifyTest, SwappedEqualSizeBlobsAreFoundByTheSidecar) {
  for (bool sidecar : {true, false}) {
    auto st = memory();
    save_on(2, *st, sidecar ? SaveOptions{} : no_sidecar());
    const format::StorageInfo a = blob_of(*st, "model.w", kW0);
    const format::StorageInfo b = blob_of(*st, "model.w", format::Shape{5, 0});
    ASSERT_NE(a.relative_path, b.relative_path);
    ASSERT_EQ(a.length, b.length);
    std::string fa = read_all(*st, a.relative_path), fb = read_all(*st, b.relative_path);
    const std::string blob_a = fa.substr(a.offset, a.length), blob_b = fb.substr(b.offset, b.length);
    ASSERT_NE(blob_a, blob_b);
    fa.replace(a.offset, a.length, blob_b);
    fb.replace(b.offset, b.length, blob_a);
    write_all(*st, a.relative_path, fa);
    write_all(*st, b.relative_path, fb);
    VerifyReport r = check(st);
    if (!sidecar) {
      EXPECT_TRUE(r.ok()) << all_messages(r);
      continue;
    }
    ASSERT_EQ(r.problems.size(), 2u) << all_messages(r);
    EXPECT_EQ(r.problems[0].file, a.relative_path);
    EXPECT_EQ(r.problems[0].item, "model.w chunk [0:5, 0:3]");
    EXPECT_EQ(r.problems[1].file, b.relative_path);
    EXPECT_EQ(r.problems[1].item, "model.w chunk [5:10, 0:3]");
    for (const auto& p : r.problems) {
      EXPECT_TRUE(contains(p.message, "checksum mismatch")) << p.message;
      EXPECT_TRUE(contains(p.message, p.file)) << p.message;
    }
  }
}

TEST(VerifyTest, EveryDamagedBlobIsListed) {
  auto st = memory();
  save_on(2, *st, no_sidecar());
  const format::StorageInfo a = blob_of(*st, "model.w", kW0);
  const format::StorageInfo b = blob_of(*st, "model.w", format::Shape{5, 0});
  const format::StorageInfo o = blob_of(*st, "epoch", std::nullopt);
  flip(*st, a.relative_path, a.offset + record_of(*st, a, "data/0").data_offset);
  flip(*st, b.relative_path, b.offset + record_of(*st, b, "data/0").data_offset);
  const torchfile::ZipEntry version = record_of(*st, o, "version");
  flip(*st, o.relative_path, o.offset + version.data_offset);
  VerifyReport r = check(st);
  ASSERT_EQ(r.problems.size(), 3u) << all_messages(r);
  std::set<std::string> items;
  for (const auto& p : r.problems) items.insert(p.item);
  EXPECT_EQ(items, (std::set<std::string>{"model.w chunk [0:5, 0:3]", "model.w chunk [5:10, 0:3]", "epoch"}));
}

// The CRC-32s shardpoint's save writes into every blob are what a zip reader independent of
// ours computes: each blob, cut out of its .distcp file, passes Python's zipfile.testzip()
// (and `unzip -t` when installed).
TEST(VerifyTest, SavedBlobsPassIndependentZipReaders) {
  auto st = memory();
  save_on(2, *st);
  TempDir dir;
  std::string paths;
  int n = 0;
  for (const auto& [index, info] : read_metadata(*st).storage_data) {
    const std::string file = read_all(*st, info.relative_path);
    const std::string path = dir.file("blob" + std::to_string(n++) + ".zip");
    shardpoint::testing::write_text(
        path, file.substr(static_cast<std::size_t>(info.offset), static_cast<std::size_t>(info.length)));
    paths += " " + path;
  }
  auto py = shardpoint::testing::run_command(
      "/usr/bin/python3 -c \"import zipfile,sys; bad=[p for p in sys.argv[1:] if zipfile.ZipFile(p).testzip()]; "
      "print('bad', bad) if bad else print('ok', len(sys.argv) - 1)\"" +
      paths + " 2>&1");
  EXPECT_EQ(py.exit_code, 0) << py.output;
  EXPECT_EQ(py.output, "ok " + std::to_string(n) + "\n");
  if (shardpoint::testing::run_command("command -v unzip >/dev/null 2>&1").exit_code == 0) {
    for (int i = 0; i < n; ++i) {
      auto uz =
          shardpoint::testing::run_command("unzip -tq " + dir.file("blob" + std::to_string(i) + ".zip") + " 2>&1");
      EXPECT_EQ(uz.exit_code, 0) << uz.output;
    }
  }
}

// Sets the central directory's and the data descriptor's CRC-32 of every record named
// `suffix` in the archive `bytes` (starting at `base`, `length` long) to 0, as PyTorch does
// with torch.serialization.config.save.compute_crc32 = False.
void drop_crc(std::string& bytes, std::uint64_t base, std::uint64_t length, const std::string& suffix) {
  const std::string blob = bytes.substr(static_cast<std::size_t>(base), static_cast<std::size_t>(length));
  MemorySource source(as_bytes(blob), "blob");
  torchfile::ZipArchive archive(source);
  for (const auto& e : archive.entries()) {
    if (!e.name.ends_with("/" + suffix)) continue;
    // The descriptor: PK\7\8 then the CRC.
    const std::size_t dd = static_cast<std::size_t>(base + e.data_offset + e.uncompressed_size);
    ASSERT_EQ(bytes.substr(dd, 4), std::string("PK\x07\x08", 4));
    bytes.replace(dd + 4, 4, std::string(4, '\0'));
    // The central entry: "PK\1\2" ... name; its CRC is at +16.
    std::string sig("PK\x01\x02", 4);
    for (std::size_t at = bytes.find(sig, static_cast<std::size_t>(base)); at < base + length;
         at = bytes.find(sig, at + 1)) {
      const std::uint16_t name_len = get_le<std::uint16_t>(as_bytes(bytes).data() + at + 28);
      if (bytes.compare(at + 46, name_len, e.name) == 0) bytes.replace(at + 16, 4, std::string(4, '\0'));
    }
  }
}

TEST(VerifyTest, RecordsWithoutCrcAreNoChecksumNeverVerified) {
  auto st = memory();
  save_on(2, *st, no_sidecar());
  const format::StorageInfo w = blob_of(*st, "model.w", kW0);
  std::string file = read_all(*st, w.relative_path);
  drop_crc(file, w.offset, w.length, "data/0");
  write_all(*st, w.relative_path, file);
  VerifyReport r = check(st);
  EXPECT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.coverage[0].no_checksum_records, 1u);
  EXPECT_EQ(r.coverage[0].no_checksum_bytes, 5u * 3u * 4u);
  EXPECT_EQ(r.bytes - r.verified_bytes, 5u * 3u * 4u);

  // Damaged now, it is still "no checksum": nothing can tell.
  flip(*st, w.relative_path, w.offset + record_of(*st, w, "data/0").data_offset);
  EXPECT_TRUE(check(st).ok());
}

// torch.save files: meta.pt of a checkpoint and a file on its own.
std::string small_torch_save() {
  StateNode root{StateDict{}};
  root.set("epoch", StateNode(pickle::Value::integer(1)));
  root.set("name", StateNode(pickle::Value::str("run")));
  StringSink sink;
  write_torch_save(root, sink, TorchSaveFileOptions{"meta"});
  return sink.str();
}

TEST(VerifyTest, MetaPtIsCheckedAsATorchSaveFile) {
  auto st = memory();
  save_on(2, *st);
  std::string meta = small_torch_save();
  write_all(*st, "meta.pt", meta);
  VerifyReport clean = check(st);
  EXPECT_TRUE(clean.ok()) << all_messages(clean);
  ASSERT_EQ(clean.coverage.size(), 2u);
  EXPECT_EQ(clean.coverage[1].kind, CheckpointKind::kTorchSave);
  EXPECT_EQ(clean.coverage[1].zip_crc32_records, clean.coverage[1].records);

  MemorySource source(as_bytes(meta), "meta");
  torchfile::ZipArchive archive(source);
  const torchfile::ZipEntry* pkl = archive.find("meta/data.pkl");
  ASSERT_NE(pkl, nullptr);
  meta[static_cast<std::size_t>(pkl->data_offset + pkl->uncompressed_size - 3)] ^= 0x01;
  write_all(*st, "meta.pt", meta);
  VerifyReport r = check(st);
  ASSERT_EQ(r.problems.size(), 1u) << all_messages(r);
  EXPECT_EQ(r.problems[0].item, "meta/data.pkl");
  EXPECT_TRUE(contains(r.problems[0].message, "record \"meta/data.pkl\", bytes [")) << r.problems[0].message;
}

TEST(VerifyTest, TorchSaveFileOnDisk) {
  TempDir dir;
  const std::string path = dir.file("m.pt");
  std::string bytes = small_torch_save();
  shardpoint::testing::write_text(path, bytes);
  VerifyReport r = verify(path);
  EXPECT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.kind, CheckpointKind::kTorchSave);
  EXPECT_GT(r.bytes, 0u);
  EXPECT_EQ(r.verified_bytes, r.bytes);

  shardpoint::testing::write_text(path, bytes.substr(0, bytes.size() / 2));
  r = verify(path);
  ASSERT_EQ(r.problems.size(), 1u) << all_messages(r);
  EXPECT_EQ(r.problems[0].file, path);
  EXPECT_TRUE(contains(r.problems[0].message, path)) << r.problems[0].message;

  EXPECT_THROW(verify(dir.file("missing")), StorageError);
}

// A torch.save file written by Debian's PyTorch 1.13 (/usr/bin/python3): clean, every byte
// verified by its records' CRC-32s; a flipped byte of tensor data is a mismatch naming the
// file, the record and its byte range.
TEST(VerifyTorchTest, Torch113FileCleanAndDamaged) {
  SP_REQUIRE_TORCH113(python);
  TempDir dir;
  const std::string path = dir.file("t113.pt");
  auto saved = shardpoint::testing::run_command(
      python +
      " -c \"import torch,sys; torch.save({'w': torch.arange(4096, dtype=torch.float32), "
      "'b': torch.ones(3, dtype=torch.int64), 'step': 3}, sys.argv[1])\" " +
      path + " 2>&1");
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  VerifyReport r = verify(path);
  EXPECT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.tensors, 2u);
  EXPECT_GT(r.bytes, 4096u * 4u);
  EXPECT_EQ(r.verified_bytes, r.bytes);
  ASSERT_EQ(r.coverage.size(), 1u);
  EXPECT_EQ(r.coverage[0].zip_crc32_records, r.coverage[0].records);

  std::string bytes = shardpoint::testing::read_text(path);
  MemorySource source(as_bytes(bytes), path);
  torchfile::ZipArchive archive(source);
  const torchfile::ZipEntry* w = nullptr;
  for (const auto& e : archive.entries()) {
    if (e.uncompressed_size == 4096u * 4u) w = &e;
  }
  ASSERT_NE(w, nullptr);
  const torchfile::ZipEntry entry = *w;
  bytes[static_cast<std::size_t>(entry.data_offset + 1000)] ^= 0x08;
  shardpoint::testing::write_text(path, bytes);
  r = verify(path);
  ASSERT_EQ(r.problems.size(), 1u) << all_messages(r);
  EXPECT_EQ(r.problems[0].file, path);
  EXPECT_EQ(r.problems[0].item, entry.name);
  EXPECT_EQ(r.problems[0].message.rfind(
                path + ": zip record \"" + entry.name + "\", bytes [" + std::to_string(entry.data_offset) + ", " +
                    std::to_string(entry.data_offset + entry.uncompressed_size) + ") of the file: expected CRC-32 ",
                0),
            0u)
      << r.problems[0].message;
}

// A local folder: verify(path) finds it a DCP checkpoint.
TEST(VerifyTest, LocalFolder) {
  TempDir dir;
  auto st = storage::open_local_storage_at(dir.file("ckpt"));
  save_on(2, *st, no_sidecar());
  VerifyReport r = verify(dir.file("ckpt"));
  EXPECT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.kind, CheckpointKind::kDcp);
  EXPECT_EQ(r.verified_bytes, r.bytes);
}

}  // namespace
}  // namespace shardpoint::engine
