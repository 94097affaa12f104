// engine::verify() on what real PyTorch 2.6 writes (scripts/oracle-python; skipped without
// the oracle root, failed then under SHARDPOINT_REQUIRE_ORACLES=1):
//   - a DCP checkpoint saved on 2 gloo processes (tests/interop/dcp26.py, no sidecar): clean,
//     every byte verified by the zip CRC-32s; then damaged copies - a byte of tensor data, of
//     data.pkl, of a zip local header, a truncated file - each found with the file and item
//     named;
//   - torch.save and dcp.save with torch.serialization.set_crc32_options(False): every record
//     is "no checksum" (0 in the central directory), never a problem, never verified.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/byte_stream.h"
#include "launch_ranks.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/metadata.h"
#include "shardpoint/verify.h"
#include "storage/local_storage.h"
#include "test_util.h"
#include "torchfile/zip_reader.h"

namespace shardpoint {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const std::string kScript = SP_SOURCE_DIR "/tests/interop/dcp26.py";

std::string all_messages(const engine::VerifyReport& r) {
  std::string out;
  for (const auto& p : r.problems) out += p.message + "\n";
  return out;
}

// The largest tensor blob of the checkpoint and its records (offsets relative to the blob).
struct Blob {
  std::string fqn;
  format::StorageInfo info;
  std::vector<torchfile::ZipEntry> records;
  const torchfile::ZipEntry& record(const std::string& suffix) const {
    for (const auto& e : records) {
      if (e.name.ends_with("/" + suffix)) return e;
    }
    throw std::runtime_error("no record " + suffix);
  }
};

Blob largest_tensor_blob(const std::string& folder) {
  auto st = storage::open_local_storage_at(folder);
  const format::Metadata md = engine::read_metadata(*st);
  Blob best;
  for (const auto& [index, info] : md.storage_data) {
    if (index.offset && info.length > best.info.length) best = Blob{index.fqn, info, {}};
  }
  const std::string file = testing::read_text(folder + "/" + best.info.relative_path);
  const std::string blob =
      file.substr(static_cast<std::size_t>(best.info.offset), static_cast<std::size_t>(best.info.length));
  MemorySource source(as_bytes(blob), "blob");
  torchfile::ZipArchive archive(source);
  best.records = archive.entries();
  return best;
}

void flip(const std::string& path, std::uint64_t at) {
  std::string bytes = testing::read_text(path);
  bytes[static_cast<std::size_t>(at)] ^= 0x04;
  testing::write_text(path, bytes);
}

// A fresh copy of the saved checkpoint to damage.
std::string copy_of(const std::string& folder, const std::string& to) {
  fs::copy(folder, to, fs::copy_options::recursive);
  return to;
}

TEST(Verify26InteropTest, TorchDcpCheckpointCleanAndDamaged) {
  SP_REQUIRE_TORCH26(python);
  TempDir dir;
  const std::string ckpt = dir.file("torch26");
  const testing::ProcessResult saved = testing::run_process(
      {python, kScript, "save", ckpt, "--ws", "2", "--manifest", dir.file("m.json")}, {}, std::chrono::seconds(300));
  ASSERT_EQ(saved.exit_code, 0) << "PyTorch 2.6 save: " << saved.describe();

  engine::VerifyReport clean = engine::verify(ckpt);
  EXPECT_TRUE(clean.ok()) << all_messages(clean);
  EXPECT_GT(clean.bytes, 0u);
  EXPECT_EQ(clean.verified_bytes, clean.bytes);
  ASSERT_FALSE(clean.coverage.empty());
  EXPECT_EQ(clean.coverage[0].sidecar, engine::ChecksumAlgorithm::kNone);
  EXPECT_EQ(clean.coverage[0].zip_crc32_records, clean.coverage[0].records);

  const Blob blob = largest_tensor_blob(ckpt);
  const std::uint64_t base = blob.info.offset;
  struct Damage {
    const char* what;
    std::uint64_t at;  // in the file; 0 with truncate
    bool truncate;
    const char* needle;
  };
  const torchfile::ZipEntry& data = blob.record("data/0");
  const torchfile::ZipEntry& pkl = blob.record("data.pkl");
  const Damage damages[] = {
      {"tensor data", base + data.data_offset + data.uncompressed_size / 2, false, "zip record"},
      // A byte in the middle of data.pkl: the pickle may still parse (then its zip CRC-32
      // fails) or not (a structure problem); either way the file and item are named.
      {"data.pkl", base + pkl.data_offset + pkl.uncompressed_size / 2, false, ""},
      {"local header CRC field", base + data.local_header_offset + 14, false, "zip local header"},
      {"truncated file", 0, true, "truncated"},
  };
  int n = 0;
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    const std::string copy = copy_of(ckpt, dir.file("damaged" + std::to_string(n++)));
    const std::string file = copy + "/" + blob.info.relative_path;
    if (d.truncate) {
      fs::resize_file(file, base + blob.info.length - 10);
    } else {
      flip(file, d.at);
    }
    engine::VerifyReport r = engine::verify(copy);
    ASSERT_FALSE(r.ok());
    bool named = false;
    for (const auto& p : r.problems) {
      named |= p.file == blob.info.relative_path && p.item.rfind(blob.fqn, 0) == 0 &&
               p.message.find(blob.info.relative_path) != std::string::npos &&
               p.message.find(blob.fqn) != std::string::npos && p.message.find(d.needle) != std::string::npos;
    }
    EXPECT_TRUE(named) << all_messages(r);
  }
}

TEST(Verify26InteropTest, RecordsWrittenWithoutCrcAreNoChecksum) {
  SP_REQUIRE_TORCH26(python);
  TempDir dir;
  const std::string pt = dir.file("nocrc.pt");
  const std::string ckpt = dir.file("nocrc_dcp");
  auto r = testing::run_command(python +
                                " -c \"import sys, torch, torch.distributed.checkpoint as dcp; "
                                "torch.serialization.set_crc32_options(False); "
                                "sd = {'w': torch.arange(1000, dtype=torch.float32), 'step': 3}; "
                                "torch.save(sd, sys.argv[1]); dcp.save(sd, checkpoint_id=sys.argv[2])\" " +
                                testing::shell_quote(pt) + " " + testing::shell_quote(ckpt) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  for (const std::string& path : {pt, ckpt}) {
    SCOPED_TRACE(path);
    engine::VerifyReport report = engine::verify(path);
    EXPECT_TRUE(report.ok()) << all_messages(report);
    EXPECT_GT(report.bytes, 0u);
    EXPECT_EQ(report.verified_bytes, 0u);
    ASSERT_FALSE(report.coverage.empty());
    const engine::VerifyCoverage& c = report.coverage[0];
    EXPECT_GT(c.no_checksum_records, 0u);
    EXPECT_EQ(c.zip_crc32_records + c.no_checksum_records, c.records);  // only empty records match
  }
}

}  // namespace
}  // namespace shardpoint
