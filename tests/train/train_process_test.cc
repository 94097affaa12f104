// shardpoint-train as real rank processes (Gloo over TCP): a resumed run equals an
// uninterrupted one bitwise on the same world size and within 1e-5 on another, across
// sharded and full checkpoints; bad arguments fail on every rank without hanging.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "launch_ranks.h"
#include "test_util.h"
#include "torchfile/torch_file.h"

namespace shardpoint::train {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

testing::ProcessResult train(const std::vector<std::string>& args) {
  std::vector<std::string> argv{SP_TRAIN_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_process(argv, {}, std::chrono::seconds(150));
}

// The only checkpoint under root's newest version folder.
std::string newest_checkpoint(const fs::path& root) {
  int best = -1;
  fs::path found;
  for (const auto& v : fs::directory_iterator(root / "lightning_logs")) {
    const int k = std::stoi(v.path().filename().string().substr(8));
    if (k > best) {
      best = k;
      for (const auto& c : fs::directory_iterator(v.path() / "checkpoints")) found = c.path();
    }
  }
  return found.string();
}

// name -> float32 values of every tensor under state_dict and optimizer_states of a full file.
std::map<std::string, std::vector<float>> tensors_of(const std::string& path) {
  auto tf = torchfile::TorchFile::open(path);
  std::map<std::string, std::vector<float>> out;
  auto read = [&](const std::string& name, const pickle::Value& node) {
    const torchfile::TensorInfo* info = tf->tensor_of(node);
    EXPECT_NE(info, nullptr) << name;
    if (!info) return;
    std::vector<float> v(info->numel());
    tf->read_tensor(*info, std::as_writable_bytes(std::span<float>(v)));
    out[name] = std::move(v);
  };
  for (const auto& [k, v] : tf->root()->get("state_dict")->entries()) read("model/" + k->as_string(), *v);
  // Lightning's full files key the optimizer state by parameter id.
  auto state = tf->root()->get("optimizer_states")->items().at(0)->get("state");
  for (const auto& [k, per] : state->entries()) {
    EXPECT_TRUE(k->is(pickle::Kind::kInt)) << path;
    const std::string id = k->is(pickle::Kind::kInt) ? std::to_string(k->as_int()) : k->as_string();
    for (const auto& [key, t] : per->entries()) read("optim/" + id + "/" + key->as_string(), *t);
  }
  return out;
}

class TrainProcessTest : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("sp_train_test_" + std::to_string(::getpid()));
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override { fs::remove_all(dir_); }
};

TEST_F(TrainProcessTest, ResumeIsExactOnSameWorldSizeAndCloseOnAnother) {
  // SGD with momentum: Adam turns roundoff on zero-gradient elements into full-size updates,
  // so only its same-world-size resume is bitwise comparable (train_test covers Adam).
  const std::vector<std::string> common{"--strategy", "fsdp", "--optimizer", "sgd", "--momentum", "0.9",
                                        "--model-size", "tiny"};
  auto run = [&](const std::string& root, int devices, const std::string& type, int steps, const std::string& ckpt) {
    std::vector<std::string> args = common;
    for (const std::string& a : {std::string("--devices"), std::to_string(devices), std::string("--state-dict-type"), type,
                                 std::string("--max-steps"), std::to_string(steps), std::string("--root"),
                                 (dir_ / root).string()}) {
      args.push_back(a);
    }
    if (!ckpt.empty()) args.insert(args.end(), {"--ckpt-path", ckpt});
    const auto r = train(args);
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    return newest_checkpoint(dir_ / root);
  };
  const std::string straight = run("a", 4, "full", 6, "");
  const std::string half = run("b", 4, "sharded", 3, "");
  ASSERT_TRUE(fs::is_regular_file(fs::path(half) / "meta.pt")) << half;
  EXPECT_EQ(fs::path(half).filename(), "epoch=0-step=3.ckpt");
  const std::string resumed = run("b", 4, "full", 6, half);
  // A checkpoint whose shapes do not fit the model: an error on every rank, no hang.
  const auto bad = train({"--devices", "2", "--model-size", "demo", "--max-steps", "4", "--root", (dir_ / "d").string(),
                          "--ckpt-path", half});
  EXPECT_EQ(bad.exit_code, 2) << bad.describe();
  EXPECT_NE(bad.output.find("model.model.embedding.weight\": global shape mismatch"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("rank 1: "), std::string::npos) << bad.output;
  const std::string elastic = run("c", 2, "full", 6, half);

  const auto want = tensors_of(straight);
  ASSERT_EQ(want.size(), 67u * 2);  // params + momentum_buffer
  const auto same = tensors_of(resumed);
  const auto other = tensors_of(elastic);
  for (const auto& [name, v] : want) {
    ASSERT_TRUE(same.count(name) && other.count(name)) << name;
    EXPECT_EQ(std::memcmp(v.data(), same.at(name).data(), v.size() * 4), 0) << name;
    float scale = 1e-12f, diff = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      scale = std::max(scale, std::abs(v[i]));
      diff = std::max(diff, std::abs(v[i] - other.at(name)[i]));
    }
    EXPECT_LE(diff, 1e-5f * scale) << name;
  }
}

TEST_F(TrainProcessTest, BadArgumentsFailOnEveryRank) {
  auto r = train({"--devices", "2", "--state-dict-type", "local", "--root", dir_.string()});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find("Unknown state_dict_type: \"local\" (expected \"full\" or \"sharded\")"), std::string::npos)
      << r.output;
  r = train({"--devices", "2", "--max-steps", "1", "--root", dir_.string(), "--ckpt-path", (dir_ / "nothing").string()});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find("rank 0: The path"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1: The path"), std::string::npos) << r.output;
  fs::create_directories(dir_ / "not-a-ckpt");  // a folder without meta.pt is no checkpoint
  r = train({"--max-steps", "1", "--root", dir_.string(), "--ckpt-path", (dir_ / "not-a-ckpt").string()});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find("does not point to a valid checkpoint"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace shardpoint::train
