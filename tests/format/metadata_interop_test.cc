// Interop of the .metadata codec with Python: bytes written by Python's pickler (stand-in
// classes under every release's module names, and the real PyTorch 1.13) decode; what
// encode_metadata writes loads in Python with the right field values.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "format/metadata_codec.h"
#include "format/sample_metadata.h"
#include "shardpoint/error.h"
#include "test_util.h"

namespace shardpoint::format {
namespace {

using nlohmann::json;
using shardpoint::testing::read_text;
using shardpoint::testing::run_command;
using shardpoint::testing::TempDir;
using shardpoint::testing::write_text;
using testing::expect_sample;
using testing::sample_metadata;

const std::string kOracle = std::string(SP_SOURCE_DIR) + "/tests/format/metadata_oracle.py";

// Plain Python 3 (no torch needed) for the stand-in class tests.
#define SP_REQUIRE_PYTHON3(python_var)                                                           \
  std::string python_var = "/usr/bin/python3";                                                   \
  if (run_command(python_var + " -c 'import dataclasses' 2>/dev/null").exit_code != 0) {         \
    if (::shardpoint::testing::oracles_required()) FAIL() << "oracle missing: /usr/bin/python3"; \
    GTEST_SKIP() << "oracle missing: /usr/bin/python3";                                          \
  }

// Runs a command that must succeed; returns its stdout (stderr goes to the test log).
std::string run_ok(const std::string& command) {
  auto r = run_command(command);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  return r.output;
}

Metadata decode_file(const std::string& path) {
  std::string bytes = read_text(path);
  return decode_metadata(as_bytes(bytes), path);
}

class StubFormTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(StubFormTest, PythonPicklerOutputDecodes) {
  SP_REQUIRE_PYTHON3(python);
  const auto& [form, protocol] = GetParam();
  TempDir dir;
  const std::string path = dir.file(".metadata");
  run_ok(python + " " + kOracle + " stub-write " + form + " " + std::to_string(protocol) + " " + path);
  Metadata md = decode_file(path);
  const bool transforms = form == "2.7" || form == "2.9" || form == "3.13";
  expect_sample(md, form != "1.13", transforms);
  const bool has_meta = form == "2.4" || transforms;
  ASSERT_EQ(md.storage_meta.has_value(), has_meta);
  if (has_meta) {
    EXPECT_EQ(md.storage_meta->checkpoint_id, "/tmp/ckpt");
    EXPECT_EQ(md.storage_meta->save_id, "3f2c6a1e-save");
    const std::vector<std::string> modules =
        form == "2.4" ? std::vector<std::string>{} : std::vector<std::string>{"model", "opt"};
    EXPECT_EQ(md.storage_meta->modules, modules);
  }
  EXPECT_EQ(md.version.has_value(), form == "2.9" || form == "3.13");
}

INSTANTIATE_TEST_SUITE_P(AllReleases, StubFormTest,
                         ::testing::Combine(::testing::Values("1.13", "2.0", "2.3", "2.4", "2.7", "2.9", "3.13"),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_p" + std::to_string(std::get<1>(info.param));
                           for (char& c : n) {
                             if (c == '.') c = '_';
                           }
                           return n;
                         });

// Checks the JSON description metadata_oracle.py prints against sample_metadata().
void expect_python_sees_sample(const json& j, bool check_globals) {
  EXPECT_EQ(j["class"], "Metadata");
  EXPECT_EQ(j["keys"], json({"planner_data", "state_dict_metadata", "storage_data"}));
  const json& w = j["sdm"]["model.w"];
  EXPECT_EQ(w["kind"], "tensor");
  EXPECT_EQ(w["dtype"], "torch.float32");
  EXPECT_EQ(w["layout"], "torch.strided");
  EXPECT_EQ(w["requires_grad"], false);
  EXPECT_EQ(w["pin_memory"], false);
  EXPECT_EQ(w["size"], json({4, 6}));
  EXPECT_EQ(w["size_type"], "Size");
  EXPECT_EQ(w["chunks"], json::parse("[[[0,0],[2,6]],[[2,0],[2,6]]]"));
  EXPECT_EQ(j["sdm"]["model.b"]["dtype"], "torch.bfloat16");
  EXPECT_EQ(j["sdm"]["model.b"]["requires_grad"], true);
  EXPECT_EQ(j["sdm"]["s"]["size"], json::array());
  EXPECT_EQ(j["sdm"]["s"]["chunks"], json::parse("[[[],[]]]"));
  EXPECT_EQ(j["sdm"]["step"]["kind"], "bytes");
  EXPECT_EQ(j["sdm"]["step"]["type"], "BytesStorageMetadata");
  EXPECT_EQ(j["planner_data"]["opt.0.lr"], json::parse(R"(["opt", 0, "lr"])"));
  EXPECT_EQ(j["planner_data"]["model.w"], json::parse(R"(["model", "w"])"));
  ASSERT_EQ(j["storage_data"].size(), 5u);
  for (const json& e : j["storage_data"]) {
    if (e["fqn"] == "step") {
      EXPECT_EQ(e["key_has_offset"], false);
      EXPECT_TRUE(e["index"].is_null());
      EXPECT_EQ(e["file_offset"], 2194);
      EXPECT_EQ(e["length"], 431);
      EXPECT_EQ(e["relative_path"], "__0_0.distcp");
    } else if (e["fqn"] == "model.w" && e["offset"] == json({2, 0})) {
      EXPECT_EQ(e["index"], 1);
      EXPECT_EQ(e["relative_path"], "__1_0.distcp");
      EXPECT_EQ(e["length"], 700);
    } else if (e["fqn"] == "s") {
      EXPECT_EQ(e["key_has_offset"], true);
      EXPECT_EQ(e["offset"], json::array());
    }
  }
  if (check_globals) {
    const std::string meta = "torch.distributed.checkpoint.metadata.";
    const std::string shard = "torch.distributed._shard.sharded_tensor.metadata.";
    std::vector<std::string> want = {shard + "MEM_FORMAT_ENCODING",
                                     shard + "TensorProperties",
                                     meta + "BytesStorageMetadata",
                                     meta + "ChunkStorageMetadata",
                                     meta + "Metadata",
                                     meta + "MetadataIndex",
                                     meta + "TensorStorageMetadata",
                                     "torch.distributed.checkpoint.filesystem._StorageInfo",
                                     "torch.Size",
                                     "torch.bfloat16",
                                     "torch.float32",
                                     "torch.int64",
                                     "torch.serialization._get_layout"};
    std::sort(want.begin(), want.end());
    EXPECT_EQ(j["globals"].get<std::vector<std::string>>(), want);
  }
}

TEST(MetadataInteropTest, PythonLoadsEncodedMetadata) {
  SP_REQUIRE_PYTHON3(python);
  TempDir dir;
  const std::string path = dir.file(".metadata");
  write_text(path, encode_metadata(sample_metadata()));
  json j = json::parse(run_ok(python + " " + kOracle + " stub-load " + path));
  expect_python_sees_sample(j, true);
}

TEST(MetadataInteropTest, Torch113LoadsEncodedMetadata) {
  SP_REQUIRE_TORCH113(python);
  TempDir dir;
  const std::string path = dir.file(".metadata");
  write_text(path, encode_metadata(sample_metadata()));
  std::string out = run_ok(python + " " + kOracle + " torch113-load " + path);
  json j = json::parse(out);
  expect_python_sees_sample(j, true);
  EXPECT_EQ(j["sdm"]["model.w"]["memory_format"], "torch.contiguous_format");
}

// Real PyTorch 1.13 output: decode, then check every truncation and many byte flips.
class Torch113Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run_command("/usr/bin/python3 -c 'import torch' 2>/dev/null");
    if (r.exit_code != 0) return;
    auto w = run_command("/usr/bin/python3 " + kOracle + " torch113-write " + dir_->path().string() + " 2>&1");
    if (w.exit_code == 0) bytes_ = new std::string(read_text(dir_->file(".metadata")));
  }
  static void TearDownTestSuite() {
    delete bytes_;
    bytes_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  static TempDir* dir_;
  static std::string* bytes_;
};
TempDir* Torch113Test::dir_ = nullptr;
std::string* Torch113Test::bytes_ = nullptr;

#define SP_REQUIRE_REAL_BYTES()       \
  SP_REQUIRE_TORCH113(python_unused); \
  (void)python_unused;                \
  ASSERT_NE(bytes_, nullptr) << "torch113-write failed"

TEST_F(Torch113Test, RealMetadataDecodes) {
  SP_REQUIRE_REAL_BYTES();
  ASSERT_GE(bytes_->size(), 3u);
  EXPECT_EQ(static_cast<unsigned char>((*bytes_)[1]), 4);  // protocol 4, as Python 3.11 writes
  Metadata md = decode_metadata(as_bytes(*bytes_), ".metadata");
  ASSERT_EQ(md.state_dict_metadata.size(), 5u);
  const auto& w = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("model.w"));
  EXPECT_EQ(w.properties.dtype, DType::kFloat32);
  EXPECT_EQ(w.size, (Shape{4, 6}));
  ASSERT_EQ(w.chunks.size(), 1u);
  EXPECT_EQ(w.chunks[0], (ChunkStorageMetadata{{0, 0}, {4, 6}}));
  EXPECT_TRUE(check_chunk_tiling(w).empty());
  const auto& b = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("model.b"));
  EXPECT_EQ(b.properties.dtype, DType::kBFloat16);
  EXPECT_EQ(b.size, (Shape{6}));
  const auto& s = std::get<TensorStorageMetadata>(md.state_dict_metadata.at("s"));
  EXPECT_EQ(s.properties.dtype, DType::kInt64);
  EXPECT_TRUE(s.size.empty());
  ASSERT_EQ(s.chunks.size(), 1u);
  EXPECT_TRUE(s.chunks[0].offsets.empty());
  EXPECT_TRUE(std::holds_alternative<BytesStorageMetadata>(md.state_dict_metadata.at("step")));
  EXPECT_TRUE(std::holds_alternative<BytesStorageMetadata>(md.state_dict_metadata.at("nested")));
  EXPECT_EQ(md.planner_data_raw, nullptr);  // 1.13 writes None
  EXPECT_FALSE(md.storage_meta.has_value());

  // storage_data: one entry per item; all in __0_0.distcp (single_file_per_rank), items
  // back to back, and the file is exactly as long as the last item's end.
  ASSERT_EQ(md.storage_data.size(), 5u);
  std::uint64_t end = 0;
  for (const auto& [k, v] : md.storage_data) {
    EXPECT_EQ(v.relative_path, "__0_0.distcp") << k.fqn;
    EXPECT_GT(v.length, 0u);
    end = std::max(end, v.offset + v.length);
    EXPECT_EQ(k.offset.has_value(), k.fqn != "step" && k.fqn != "nested") << k.fqn;
  }
  EXPECT_EQ(end, std::filesystem::file_size(dir_->file("__0_0.distcp")));
  auto s_key = md.storage_data.find(MetadataIndex{"s", Shape{}, {}});
  ASSERT_NE(s_key, md.storage_data.end());
  EXPECT_EQ(s_key->first.index, 0);

  // Re-encoded, it decodes to the same content.
  EXPECT_TRUE(same_encoded_content(md, decode_metadata(as_bytes(encode_metadata(md)), "re-encoded")));
}

// PyTorch 1.13's load_state_dict reads the checkpoint after shardpoint rewrote its
// .metadata (decode + encode, 2.x module names aliased to 1.13's classes).
TEST_F(Torch113Test, Torch113LoadsCheckpointWithReencodedMetadata) {
  SP_REQUIRE_REAL_BYTES();
  TempDir copy;
  for (const auto& e : std::filesystem::directory_iterator(dir_->path())) {
    std::filesystem::copy_file(e.path(), copy.path() / e.path().filename());
  }
  Metadata md = decode_metadata(as_bytes(*bytes_), ".metadata");
  const std::string encoded = encode_metadata(md);
  ASSERT_NE(encoded, *bytes_);
  write_text(copy.file(".metadata"), encoded);
  EXPECT_EQ(run_ok("/usr/bin/python3 " + kOracle + " torch113-load-state " + copy.path().string()), "ok\n");
}

TEST_F(Torch113Test, EveryTruncationOfRealBytesIsAnError) {
  SP_REQUIRE_REAL_BYTES();
  for (std::size_t n = 0; n < bytes_->size(); ++n) {
    std::string cut = bytes_->substr(0, n);
    EXPECT_THROW(decode_metadata(as_bytes(cut), ".metadata"), FormatError) << "length " << n;
  }
}

TEST_F(Torch113Test, ByteFlipsOfRealBytesNeverCrash) {
  SP_REQUIRE_REAL_BYTES();
  std::mt19937 rng(77);
  int decoded = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string m = *bytes_;
    int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) m[rng() % m.size()] = static_cast<char>(rng() & 0xff);
    try {
      Metadata md = decode_metadata(as_bytes(m), ".metadata");
      (void)encode_metadata(md);
      ++decoded;
    } catch (const FormatError&) {
    }
  }
  // Some flips land in strings (fqn, file names) and still decode.
  EXPECT_GT(decoded, 0);
}

}  // namespace
}  // namespace shardpoint::format
