// The zip CRC-32 checks of torch.save files read by `reshard` (a torch.save SRC),
// `inspect --hash` and `consolidate` (the folder's meta.pt), end to end (the built binary).
// For each: the clean file passes and reports records checked; a byte flipped inside a
// tensor's storage record, or inside data.pkl (the pickle still parses), fails with one line
// naming the file, the record, its byte range (and the tensor), and leaves no output;
// --no-zip-crc reads the same damaged file without the check.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <regex>
#include <vector>

#include "comm/thread_communicator.h"
#include "core/byte_stream.h"
#include "engine/checkpoint_test_state.h"
#include "engine/torch_save.h"
#include "shardpoint/checkpoint.h"
#include "storage/local_storage.h"
#include "test_util.h"
#include "tool_run.h"
#include "torchfile/torch_file.h"

namespace shardpoint {
namespace {

namespace fs = std::filesystem;
using shardpoint::testing::run_command;
using shardpoint::testing::TempDir;

const std::string kTool = SP_SHARDPOINT;

std::string q(const std::string& s) { return "'" + s + "'"; }

using shardpoint::testing::ToolRun;

ToolRun tool(const std::string& args, const TempDir& scratch) { return shardpoint::testing::run_tool(args, scratch); }

// The N of "zip CRC-32: N records checked" in text, or -1.
long records_checked(const std::string& text) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("zip CRC-32: ([0-9]+) records checked"))) return -1;
  return std::stol(m[1]);
}

// A marker string inside data.pkl: flipping its case keeps the pickle parseable.
constexpr const char* kMarker = "marker-1";

// {"model": {"w": float32 [64, 16], "b": float32 [16]}, "note": kMarker} with torch.save's
// layout (storages data/0, data/1 in tree order).
void write_torch_file(const std::string& path) {
  std::vector<float> w(std::size_t{64} * 16), b(16);
  std::iota(w.begin(), w.end(), 0.0f);
  std::iota(b.begin(), b.end(), 0.5f);
  engine::StateDict model;
  model.emplace_back("w", engine::StateNode(engine::TensorShard{
                              DType::kFloat32, {64, 16}, {0, 0}, {64, 16}, std::as_writable_bytes(std::span(w))}));
  model.emplace_back("b", engine::StateNode(engine::TensorShard{
                              DType::kFloat32, {16}, {0}, {16}, std::as_writable_bytes(std::span(b))}));
  engine::StateNode root{engine::StateDict{}};
  root.set("model", engine::StateNode(std::move(model)));
  root.set("note", engine::StateNode(pickle::Value::str(kMarker)));
  StringSink sink;
  engine::write_torch_save(root, sink);
  testing::write_text(path, sink.str());
}

// Where a record's data lies in a torch.save file: "[a, b)".
std::string record_range(const std::string& path, const std::string& record) {
  auto f = torchfile::TorchFile::open(path);
  const torchfile::ZipEntry* e = f->record(record);
  return "[" + std::to_string(e->data_offset) + ", " + std::to_string(e->data_offset + e->uncompressed_size) + ")";
}

// Copies `from` to `to` with one byte of record data/0 flipped.
void flip_tensor_byte(const std::string& from, const std::string& to) {
  std::uint64_t at = 0;
  {
    auto f = torchfile::TorchFile::open(from);
    at = f->record("data/0")->data_offset + 100;
  }
  std::string bytes = testing::read_text(from);
  bytes[static_cast<std::size_t>(at)] ^= 0x10;
  testing::write_text(to, bytes);
}

// Copies `from` to `to` with the marker's first letter upper-cased inside data.pkl.
void flip_pickle_byte(const std::string& from, const std::string& to) {
  std::string bytes = testing::read_text(from);
  const std::size_t at = bytes.find(kMarker);
  ASSERT_NE(at, std::string::npos);
  bytes[at] ^= 0x20;
  testing::write_text(to, bytes);
}

// The command failed (exit 1) with one line on stderr that holds `text`.
void expect_one_line_failure(const ToolRun& run, const std::string& text) {
  EXPECT_EQ(run.code, 1);
  EXPECT_EQ(testing::line_count(run.err), 1u) << run.err;
  EXPECT_NE(run.err.find(text), std::string::npos) << run.err;
}

TEST(TorchFileCrcCli, ReshardChecksATorchSaveSource) {
  TempDir dir;
  const std::string src = dir.file("full.pt");
  write_torch_file(src);
  ToolRun clean = tool("reshard " + q(src) + " " + q(dir.file("clean")) + " --ranks 2", dir);
  ASSERT_EQ(clean.code, 0) << clean.err;
  // data.pkl, byteorder, version, .data/serialization_id, data/0, data/1
  EXPECT_EQ(records_checked(clean.out), 6) << clean.out;
  EXPECT_EQ(clean.out.find("in part"), std::string::npos) << clean.out;

  flip_tensor_byte(src, dir.file("tensor.pt"));
  ToolRun bad = tool("reshard " + q(dir.file("tensor.pt")) + " " + q(dir.file("out1")) + " --ranks 2", dir);
  expect_one_line_failure(bad, dir.file("tensor.pt") +
                                   ": tensor \"model.w\": zip record \"archive/data/0\" (file bytes " +
                                   record_range(src, "data/0") + "): CRC-32 mismatch");
  EXPECT_FALSE(fs::exists(dir.file("out1")));
  ToolRun off =
      tool("reshard --no-zip-crc " + q(dir.file("tensor.pt")) + " " + q(dir.file("out2")) + " --ranks 2", dir);
  EXPECT_EQ(off.code, 0) << off.err;
  EXPECT_EQ(records_checked(off.out), -1) << off.out;

  flip_pickle_byte(src, dir.file("pickle.pt"));
  bad = tool("reshard " + q(dir.file("pickle.pt")) + " " + q(dir.file("out3")) + " --ranks 2", dir);
  expect_one_line_failure(bad, dir.file("pickle.pt") + ": zip record \"archive/data.pkl\" (file bytes " +
                                   record_range(src, "data.pkl") + "): CRC-32 mismatch");
  EXPECT_FALSE(fs::exists(dir.file("out3")));
  off = tool("reshard --no-zip-crc " + q(dir.file("pickle.pt")) + " " + q(dir.file("out4")) + " --ranks 2", dir);
  EXPECT_EQ(off.code, 0) << off.err;
}

TEST(TorchFileCrcCli, InspectHashChecksATorchSaveFile) {
  TempDir dir;
  const std::string src = dir.file("full.pt");
  write_torch_file(src);
  ToolRun clean = tool("inspect --hash " + q(src), dir);
  ASSERT_EQ(clean.code, 0) << clean.err;
  EXPECT_EQ(records_checked(clean.out), 6) << clean.out;

  flip_tensor_byte(src, dir.file("tensor.pt"));
  ToolRun bad = tool("inspect --hash " + q(dir.file("tensor.pt")), dir);
  expect_one_line_failure(bad, dir.file("tensor.pt") +
                                   ": tensor \"model.w\": zip record \"archive/data/0\" (file bytes " +
                                   record_range(src, "data/0") + "): CRC-32 mismatch");
  ToolRun off = tool("inspect --hash --no-zip-crc " + q(dir.file("tensor.pt")), dir);
  EXPECT_EQ(off.code, 0) << off.err;
  EXPECT_EQ(records_checked(off.out), -1) << off.out;

  flip_pickle_byte(src, dir.file("pickle.pt"));
  bad = tool("inspect --hash " + q(dir.file("pickle.pt")), dir);
  expect_one_line_failure(bad, dir.file("pickle.pt") + ": zip record \"archive/data.pkl\" (file bytes " +
                                   record_range(src, "data.pkl") + "): CRC-32 mismatch");
  off = tool("inspect --hash --no-zip-crc " + q(dir.file("pickle.pt")), dir);
  EXPECT_EQ(off.code, 0) << off.err;
}

// A Lightning-shaped folder: the engine test state saved by 2 ranks ("optim" renamed
// "optimizer_0") and a meta.pt holding a tensor and the marker.
void save_folder(const std::string& folder) {
  std::vector<engine::testing::RankState> states;
  for (int r = 0; r < 2; ++r) {
    states.push_back(engine::testing::make_rank_state(r, 2, true));
    for (auto& [k, v] : states.back().root.dict()) {
      if (k == "optim") k = "optimizer_0";
    }
  }
  auto st = storage::open_local_storage_at(folder);
  comm::ThreadGroup group(2);
  group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });

  using pickle::Value;
  std::vector<float> rng(32);
  std::iota(rng.begin(), rng.end(), 1.0f);
  engine::StateNode root{engine::StateDict{}};
  root.set("epoch", engine::StateNode(Value::integer(1)));
  root.set("global_step", engine::StateNode(Value::integer(3)));
  root.set("pytorch-lightning_version", engine::StateNode(Value::str("2.6.0")));
  root.set("lr_schedulers", engine::StateNode(Value::list()));
  root.set("rng", engine::StateNode(
                      engine::TensorShard{DType::kFloat32, {32}, {0}, {32}, std::as_writable_bytes(std::span(rng))}));
  root.set("note", engine::StateNode(Value::str(kMarker)));
  StringSink sink;
  engine::write_torch_save(root, sink, engine::TorchSaveFileOptions{"meta"});
  testing::write_text(folder + "/meta.pt", sink.str());
}

// The N of "zip_crc_records": N in consolidate --stats, or -1.
long stats_records(const std::string& err) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex("\"zip_crc_records\": ([0-9]+)"))) return -1;
  return std::stol(m[1]);
}

TEST(TorchFileCrcCli, ConsolidateChecksMetaPt) {
  TempDir dir;
  const std::string folder = dir.file("ckpt");
  save_folder(folder);
  const std::string meta = folder + "/meta.pt";
  const std::string saved = dir.file("meta.saved");
  fs::copy_file(meta, saved);
  ToolRun clean = tool("consolidate --stats " + q(folder) + " --output_file " + q(dir.file("clean.pt")), dir);
  ASSERT_EQ(clean.code, 0) << clean.err;
  // The folder has shardpoint's sidecar: only meta.pt's records are zip CRC-32 checks.
  EXPECT_EQ(stats_records(clean.err), 5) << clean.err;  // data.pkl, byteorder, data/0, version, serialization_id

  flip_tensor_byte(saved, meta);
  ToolRun bad = tool("consolidate " + q(folder) + " --output_file " + q(dir.file("out1.pt")), dir);
  expect_one_line_failure(
      bad, meta + ": zip record \"meta/data/0\" (file bytes " + record_range(saved, "data/0") + "): CRC-32 mismatch");
  EXPECT_FALSE(fs::exists(dir.file("out1.pt")));
  ToolRun off = tool("consolidate --stats --no-zip-crc " + q(folder) + " --output_file " + q(dir.file("out2.pt")), dir);
  EXPECT_EQ(off.code, 0) << off.err;
  EXPECT_EQ(stats_records(off.err), 0) << off.err;

  flip_pickle_byte(saved, meta);
  bad = tool("consolidate " + q(folder) + " --output_file " + q(dir.file("out3.pt")), dir);
  expect_one_line_failure(bad, meta + ": zip record \"meta/data.pkl\" (file bytes " + record_range(saved, "data.pkl") +
                                   "): CRC-32 mismatch");
  EXPECT_FALSE(fs::exists(dir.file("out3.pt")));
  off = tool("consolidate --no-zip-crc " + q(folder) + " --output_file " + q(dir.file("out4.pt")), dir);
  EXPECT_EQ(off.code, 0) << off.err;
}

}  // namespace
}  // namespace shardpoint
