// Loads of what real PyTorch 2.6 writes, damaged where no shardpoint sidecar can help: the
// zip CRC-32s every torch.save record carries are checked on the read path (engine load(),
// consolidate(), the PlannedReader behind the C API and the Python StorageReader).
// One oracle start (scripts/oracle-python; skipped without the oracle root, failed then
// under SHARDPOINT_REQUIRE_ORACLES=1) writes a single-process dcp.save checkpoint; every
// case damages a copy of it:
//   - a byte of tensor data, of a tensor's data.pkl, of an object's data.pkl; a truncated
//     file; two blobs of equal size swapped: each found by a load and by consolidate, with
//     the file and the item named;
//   - the undamaged checkpoint loads with every record checked; a load of part of a
//     tensor reports its data record as read only in part; check_zip_crc = false loads
//     damaged data unchecked.
// Not found without a sidecar, by design: two blobs of the same dtype and shape swapped
// (each is a consistent zip; only the sidecar binds a blob to its item, verify_test.cc).
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/byte_stream.h"
#include "engine/planned_io.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/consolidate.h"
#include "shardpoint/metadata.h"
#include "shardpoint/single_communicator.h"
#include "storage/local_storage.h"
#include "test_util.h"
#include "torchfile/zip_reader.h"

namespace shardpoint {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// a: arange as float32 [64, 32]; b: 2 * arange as float32 [32, 64] (the same byte size as
// a, another shape); c: arange(100) int64; step: the object 7. Exit 3: not PyTorch 2.6.
const char* const kSaveScript = "import sys, torch, torch.distributed.checkpoint as dcp\n"
                                "if not torch.__version__.startswith('2.6'): sys.exit(3)\n"
                                "sd = {'a': torch.arange(2048, dtype=torch.float32).reshape(64, 32),\n"
                                "      'b': (2 * torch.arange(2048, dtype=torch.float32)).reshape(32, 64),\n"
                                "      'c': torch.arange(100), 'step': 7}\n"
                                "dcp.save(sd, checkpoint_id=sys.argv[1])\n";

// The checkpoint, written by the one oracle start of this test binary.
struct Torch26Checkpoint {
  bool available = false;  // the oracle root runs PyTorch 2.6
  bool saved = false;
  std::string folder;
  std::string why;  // when not saved
};

const Torch26Checkpoint& torch26_checkpoint() {
  static TempDir dir;
  static const Torch26Checkpoint made = [] {
    Torch26Checkpoint out;
    const std::string script = dir.file("save.py");
    testing::write_text(script, kSaveScript);
    out.folder = dir.file("torch26");
    auto r = testing::run_command(std::string(SP_SOURCE_DIR) + "/scripts/oracle-python " +
                                  testing::shell_quote(script) + " " + testing::shell_quote(out.folder) + " 2>&1");
    out.available = r.exit_code != 126 && r.exit_code != 127 && r.exit_code != 3;
    out.saved = r.exit_code == 0;
    if (!out.available)
      out.why = "oracle missing: PyTorch 2.6 root; run `make oracle` (scripts/setup-oracle.sh, as root)";
    if (out.available && !out.saved) out.why = "PyTorch 2.6 save failed: " + r.output;
    return out;
  }();
  return made;
}

// Skips (fails under SHARDPOINT_REQUIRE_ORACLES=1) without the oracle.
#define SP_REQUIRE_TORCH26_CHECKPOINT(var)                            \
  const Torch26Checkpoint& var = torch26_checkpoint();                \
  if (!var.available) {                                               \
    if (::shardpoint::testing::oracles_required()) FAIL() << var.why; \
    GTEST_SKIP() << var.why;                                          \
  }                                                                   \
  ASSERT_TRUE(var.saved) << var.why

// The buffers a load fills and the template naming them.
struct Loaded {
  std::vector<float> a = std::vector<float>(2048, -1.0f);
  std::vector<float> b = std::vector<float>(2048, -1.0f);
  std::vector<std::int64_t> c = std::vector<std::int64_t>(100, -1);
  engine::StateNode state{engine::StateDict{}};

  Loaded() {
    state.set("a", engine::StateNode(shard(a, DType::kFloat32, {64, 32})));
    state.set("b", engine::StateNode(shard(b, DType::kFloat32, {32, 64})));
    state.set("c", engine::StateNode(shard(c, DType::kInt64, {100})));
    state.set("step", engine::StateNode(pickle::Value::none()));
  }
  template <typename T>
  static engine::TensorShard shard(std::vector<T>& v, DType dtype, const format::Shape& shape) {
    engine::TensorShard t;
    t.dtype = dtype;
    t.global_shape = shape;
    t.offsets = format::Shape(shape.size(), 0);
    t.sizes = shape;
    t.data = std::as_writable_bytes(std::span<T>(v));
    return t;
  }
};

engine::LoadReport load_folder(const std::string& folder, engine::StateNode& state, engine::LoadOptions options = {}) {
  auto st = storage::open_local_storage_at(folder);
  auto comm = comm::make_single_communicator();
  return engine::load(state, *st, *comm, options);
}

// The blob of fqn and its zip records (offsets relative to the blob).
struct Blob {
  format::StorageInfo info;
  std::vector<torchfile::ZipEntry> records;
  const torchfile::ZipEntry& record(const std::string& suffix) const {
    for (const auto& e : records) {
      if (e.name.ends_with("/" + suffix)) return e;
    }
    throw std::runtime_error("no record " + suffix);
  }
};

Blob blob_of(const std::string& folder, const std::string& fqn) {
  auto st = storage::open_local_storage_at(folder);
  const format::Metadata md = engine::read_metadata(*st);
  Blob out;
  for (const auto& [index, info] : md.storage_data) {
    if (index.fqn == fqn) out.info = info;
  }
  const std::string file = testing::read_text(folder + "/" + out.info.relative_path);
  const std::string blob =
      file.substr(static_cast<std::size_t>(out.info.offset), static_cast<std::size_t>(out.info.length));
  MemorySource source(as_bytes(blob), "blob");
  out.records = torchfile::ZipArchive(source).entries();
  return out;
}

// The item whose blob ends last in its file (what a truncation cuts).
std::string last_item(const std::string& folder) {
  auto st = storage::open_local_storage_at(folder);
  std::string fqn;
  std::uint64_t end = 0;
  for (const auto& [index, info] : engine::read_metadata(*st).storage_data) {
    if (info.offset + info.length > end) end = info.offset + info.length, fqn = index.fqn;
  }
  return fqn;
}

void flip(const std::string& path, std::uint64_t at) {
  std::string bytes = testing::read_text(path);
  bytes[static_cast<std::size_t>(at)] ^= 0x04;
  testing::write_text(path, bytes);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Load26InteropTest, DamageIsFoundByLoadAndConsolidate) {
  SP_REQUIRE_TORCH26_CHECKPOINT(saved);
  TempDir dir;
  const std::string& ckpt = saved.folder;
  const Blob a = blob_of(ckpt, "a");
  const Blob b = blob_of(ckpt, "b");
  const Blob step = blob_of(ckpt, "step");
  ASSERT_EQ(a.info.relative_path, b.info.relative_path);
  ASSERT_EQ(a.info.length, b.info.length);  // the swap below keeps every offset valid
  const std::string truncated_item = last_item(ckpt);

  struct Damage {
    const char* what;
    std::string item;    // the fqn the message must name
    std::string needle;  // and this text ("" when the parse may fail first)
    std::function<void(const std::string& file)> apply;
  };
  const torchfile::ZipEntry& a_data = a.record("data/0");
  const torchfile::ZipEntry& a_pkl = a.record("data.pkl");
  const torchfile::ZipEntry& step_pkl = step.record("data.pkl");
  const std::vector<Damage> damages = {
      {"tensor data", "a", "CRC-32 mismatch",
       [&](const std::string& f) { flip(f, a.info.offset + a_data.data_offset + a_data.uncompressed_size / 2); }},
      // Whether the pickle still parses or not, its CRC-32 names the damage.
      {"tensor data.pkl", "a", "zip record \"archive/data.pkl\"",
       [&](const std::string& f) { flip(f, a.info.offset + a_pkl.data_offset + a_pkl.uncompressed_size / 2); }},
      {"object data.pkl", "step", "CRC-32 mismatch",
       [&](const std::string& f) {
         flip(f, step.info.offset + step_pkl.data_offset + step_pkl.uncompressed_size / 2);
       }},
      {"truncated file", truncated_item, "", [&](const std::string& f) { fs::resize_file(f, fs::file_size(f) - 10); }},
      {"blobs of equal size swapped", "a", "shape",
       [&](const std::string& f) {
         std::string bytes = testing::read_text(f);
         const std::string blob_a = bytes.substr(a.info.offset, a.info.length);
         bytes.replace(a.info.offset, a.info.length, bytes.substr(b.info.offset, b.info.length));
         bytes.replace(b.info.offset, b.info.length, blob_a);
         testing::write_text(f, bytes);
       }},
  };
  int n = 0;
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    const std::string copy = dir.file("damaged" + std::to_string(n++));
    fs::copy(ckpt, copy, fs::copy_options::recursive);
    d.apply(copy + "/" + a.info.relative_path);
    auto names_it = [&](const std::string& m) {
      return m.find(a.info.relative_path) != std::string::npos && m.find("\"" + d.item + "\"") != std::string::npos &&
             m.find(d.needle) != std::string::npos;
    };

    Loaded loaded;
    const std::string load_error = error_of([&] { load_folder(copy, loaded.state); });
    EXPECT_TRUE(names_it(load_error)) << "load: " << load_error;

    engine::ConsolidateOptions co;
    co.checkpoint_folder = Location::parse(copy);
    co.output_file = Location::parse(copy + ".pt");
    co.layout = engine::ConsolidateLayout::kDcp;
    co.durable = false;
    const std::string consolidate_error = error_of([&] { engine::consolidate(co); });
    EXPECT_TRUE(names_it(consolidate_error)) << "consolidate: " << consolidate_error;
    EXPECT_FALSE(fs::exists(copy + ".pt"));
  }
}

TEST(Load26InteropTest, CleanLoadsCheckedPartialReadsSaySoAndTheCheckTurnsOff) {
  SP_REQUIRE_TORCH26_CHECKPOINT(saved);
  TempDir dir;
  const std::string& ckpt = saved.folder;

  Loaded loaded;
  const engine::LoadReport clean = load_folder(ckpt, loaded.state);
  for (int i = 0; i < 2048; ++i) {
    ASSERT_EQ(loaded.a[i], static_cast<float>(i));
    ASSERT_EQ(loaded.b[i], static_cast<float>(2 * i));
  }
  for (int i = 0; i < 100; ++i) ASSERT_EQ(loaded.c[i], i);
  // Four blobs of five records each (data.pkl, byteorder, data/0 or none, version,
  // serialization id), every one read whole and matched.
  EXPECT_GE(clean.zip_crc.records_checked, 16u);
  EXPECT_GE(clean.zip_crc.bytes_checked, 2 * 2048 * 4 + 100 * 8u);
  EXPECT_EQ(clean.zip_crc.records_partial, 0u);
  EXPECT_EQ(clean.zip_crc.records_no_checksum, 0u);
  // consolidate reads every tensor in slabs (a blob opened once per slab): the same records
  // checked, each once.
  engine::ConsolidateOptions co;
  co.checkpoint_folder = Location::parse(ckpt);
  co.output_file = Location::parse(dir.file("clean.pt"));
  co.layout = engine::ConsolidateLayout::kDcp;
  co.durable = false;
  co.memory_budget_bytes = 1 << 20;
  const engine::ConsolidateReport consolidated = engine::consolidate(co);
  EXPECT_EQ(consolidated.zip_crc.records_checked, clean.zip_crc.records_checked);
  EXPECT_EQ(consolidated.zip_crc.bytes_checked, clean.zip_crc.bytes_checked);
  EXPECT_EQ(consolidated.zip_crc.records_partial, 0u);

  // Rows 0..31 of a: its data record is read in part, so not checked, and said so.
  std::vector<float> half(32 * 32);
  engine::StateNode part{engine::StateDict{}};
  engine::TensorShard t;
  t.dtype = DType::kFloat32;
  t.global_shape = {64, 32};
  t.offsets = {0, 0};
  t.sizes = {32, 32};
  t.data = std::as_writable_bytes(std::span<float>(half));
  part.set("a", engine::StateNode(t));
  const engine::LoadReport partial = load_folder(ckpt, part);
  EXPECT_EQ(partial.zip_crc.records_partial, 1u);
  EXPECT_GE(partial.zip_crc.records_checked, 4u);  // a's small records
  EXPECT_EQ(half[1023], 1023.0f);

  // A flipped data byte: the PlannedReader (C API, Python StorageReader) finds it; with
  // check_zip_crc off, load() reads it unchecked.
  const Blob a = blob_of(ckpt, "a");
  const torchfile::ZipEntry& data = a.record("data/0");
  const std::string copy = dir.file("flipped");
  fs::copy(ckpt, copy, fs::copy_options::recursive);
  flip(copy + "/" + a.info.relative_path, a.info.offset + data.data_offset + 4);
  {
    auto st = storage::open_local_storage_at(copy);
    engine::PlannedReader reader(*st);
    EXPECT_TRUE(reader.checks_zip_crc());
    std::vector<float> dest(2048);
    engine::PlannedTensorRead read;
    read.blob = a.info;
    read.fqn = "a";
    read.chunk.offsets = {0, 0};
    read.chunk.sizes = {64, 32};
    read.dtype = DType::kFloat32;
    read.storage_offsets = {0, 0};
    read.lengths = {64, 32};
    read.dest = std::as_writable_bytes(std::span<float>(dest));
    const std::string m = error_of([&] { reader.read_tensors(std::span(&read, 1)); });
    EXPECT_NE(m.find("item \"a\""), std::string::npos) << m;
    EXPECT_NE(m.find("zip record \"archive/data/0\""), std::string::npos) << m;
  }
  engine::LoadOptions off;
  off.check_zip_crc = false;
  Loaded unchecked;
  const engine::LoadReport r = load_folder(copy, unchecked.state, off);
  EXPECT_EQ(r.zip_crc.records_checked, 0u);
  EXPECT_NE(unchecked.a[1], 1.0f);  // the damaged element, loaded as is
}

}  // namespace
}  // namespace shardpoint
