// shardpoint-train as real rank processes (Gloo over TCP, or MPI under mpirun): a resumed run
// equals an uninterrupted one bitwise on the same world size and within 1e-5 on another,
// across sharded and full checkpoints; ModelCheckpoint flags keep the checkpoints Lightning
// keeps; --ckpt-path last; max_epochs with accumulation; an s3:// root (moto); bad arguments
// fail on every rank without hanging and leave no version folder.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "launch_ranks.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "storage/s3_servers.h"
#include "test_util.h"
#include "torchfile/torch_file.h"

namespace shardpoint::train {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The names in a checkpoints folder.
std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// The losses rank 0 printed ("step 3/6  epoch 0  loss 5.1234 ..."), indexed by step.
std::map<int, double> losses_of(const std::string& output) {
  std::map<int, double> out;
  static const std::regex line(R"(step (\d+)/\d+  epoch \d+  loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    out[std::stoi((*it)[1].str())] = std::stod((*it)[2].str());
  }
  return out;
}

// The callbacks key and the ModelCheckpoint state of a full checkpoint file or a meta.pt.
std::pair<std::string, pickle::ValuePtr> callback_of(const std::string& file) {
  auto tf = torchfile::TorchFile::open(file);
  const auto& entries = tf->root()->get("callbacks")->entries();
  EXPECT_EQ(entries.size(), 1u) << file;
  return {entries.at(0).first->as_string(), entries.at(0).second};
}

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

std::string fmt_step(int step) { return "epoch=0-step=" + std::to_string(step) + ".ckpt"; }

class TrainProcessTest : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("sp_train_test_" + std::to_string(::getpid()));
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override { fs::remove_all(dir_); }
};

TEST_F(TrainProcessTest, ResumeIsExactOnSameWorldSizeAndCloseOnAnother) {
  // SGD with momentum: Adam turns roundoff on zero-gradient elements into full-size updates,
  // so only its same-world-size resume is bitwise comparable (train_test covers Adam).
  const std::vector<std::string> common{"--strategy", "fsdp", "--optimizer",  "sgd",
                                        "--momentum", "0.9",  "--model-size", "tiny"};
  auto run = [&](const std::string& root, int devices, const std::string& type, int steps, const std::string& ckpt) {
    std::vector<std::string> args = common;
    for (const std::string& a :
         {std::string("--devices"), std::to_string(devices), std::string("--state-dict-type"), type,
          std::string("--max-steps"), std::to_string(steps), std::string("--root"), (dir_ / root).string()}) {
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
  r = train(
      {"--devices", "2", "--max-steps", "1", "--root", dir_.string(), "--ckpt-path", (dir_ / "nothing").string()});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find("rank 0: The path"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1: The path"), std::string::npos) << r.output;
  fs::create_directories(dir_ / "not-a-ckpt");  // a folder without meta.pt is no checkpoint
  r = train({"--max-steps", "1", "--root", dir_.string(), "--ckpt-path", (dir_ / "not-a-ckpt").string()});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find("does not point to a valid checkpoint"), std::string::npos) << r.output;
  // Lightning's configuration errors, before any rank starts.
  r = train({"--devices", "2", "--save-top-k", "3", "--root", dir_.string()});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find("ModelCheckpoint(save_top_k=3, monitor=None) is not a valid configuration"),
            std::string::npos)
      << r.output;
  r = train({"--monitor", "val_loss", "--root", dir_.string()});
  EXPECT_EQ(r.exit_code, 2) << r.describe();
  EXPECT_NE(r.output.find("could not find the monitored key"), std::string::npos) << r.output;
  // Failed runs leave no empty version folder behind (Lightning creates it lazily).
  EXPECT_FALSE(fs::exists(dir_ / "lightning_logs")) << names_in(dir_ / "lightning_logs").size();
}

TEST_F(TrainProcessTest, HelpExplainsEveryFlag) {
  const auto r = train({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  for (const char* flag :
       {"--devices", "--max-steps", "--max-epochs", "--every-n-train-steps", "--save-top-k", "--save-last", "--monitor",
        "--accumulate-grad-batches", "--gradient-clip-val", "--ckpt-path", "last", "s3://", "--root",
        "--state-dict-type", "train_loss", "--async-save"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
  }
}

TEST_F(TrainProcessTest, EveryNStepsSaveLastAndResumeFromLast) {
  const std::vector<std::string> common{"--devices", "2", "--optimizer", "sgd", "--momentum", "0.9", "--save-last"};
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), common.begin(), common.end());
    const auto r = train(args);
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    return r;
  };
  run({"--state-dict-type", "sharded", "--max-steps", "5", "--every-n-train-steps", "2", "--root",
       (dir_ / "a").string()});
  const fs::path v0 = dir_ / "a/lightning_logs/version_0/checkpoints";
  // Step 2's checkpoint was removed after step 4's was committed; the run's end saves only
  // last.ckpt (every_n_train_steps turns the epoch-end top-k save off, as in Lightning).
  EXPECT_EQ(names_in(v0), (std::set<std::string>{"epoch=0-step=4.ckpt", "last.ckpt"}));
  EXPECT_TRUE(fs::is_regular_file(v0 / "last.ckpt/meta.pt"));
  const auto [key, state] = callback_of((v0 / "last.ckpt/meta.pt").string());
  EXPECT_EQ(key, "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 2, 'every_n_epochs': 0, "
                 "'train_time_interval': None}");
  EXPECT_EQ(state->get("last_model_path")->as_string(), (v0 / "last.ckpt").string());
  EXPECT_EQ(state->get("best_model_path")->as_string(), (v0 / "epoch=0-step=4.ckpt").string());
  // A newer run that died before committing its last.ckpt: not a checkpoint to "last".
  fs::create_directories(dir_ / "a/lightning_logs/version_1/checkpoints/last.ckpt");
  fs::copy_file(v0 / "last.ckpt/.metadata", dir_ / "a/lightning_logs/version_1/checkpoints/last.ckpt/.metadata");
  const auto resumed =
      run({"--state-dict-type", "full", "--max-steps", "7", "--root", (dir_ / "a").string(), "--ckpt-path", "last"});
  EXPECT_NE(resumed.output.find("loaded sharded checkpoint " + (v0 / "last.ckpt").string() + " (global_step 5)"),
            std::string::npos)
      << resumed.output;
  const fs::path v2 = dir_ / "a/lightning_logs/version_2/checkpoints";
  EXPECT_EQ(names_in(v2), (std::set<std::string>{"epoch=0-step=7.ckpt", "last.ckpt"}));
  run({"--state-dict-type", "full", "--max-steps", "7", "--root", (dir_ / "s").string()});
  const auto straight = tensors_of((dir_ / "s/lightning_logs/version_0/checkpoints/epoch=0-step=7.ckpt").string());
  const auto got = tensors_of((v2 / "epoch=0-step=7.ckpt").string());
  ASSERT_EQ(straight.size(), 67u * 2);
  for (const auto& [name, v] : straight) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_EQ(std::memcmp(v.data(), got.at(name).data(), v.size() * 4), 0) << name;
  }
}

// --async-save: every checkpoint of a 4-rank run saving at every step is committed (meta.pt
// and .metadata), the commit of each happening before the next save or the run's end;
// resuming from "last" equals a straight run bitwise; a 2-rank run resumes from one of them
// and, saving asynchronously with save_top_k 1, removes each superseded checkpoint only
// after its successor is committed.
TEST_F(TrainProcessTest, AsyncSaveCommitsEveryCheckpointAndResumesExactly) {
  const std::vector<std::string> common{"--optimizer", "sgd", "--momentum", "0.9", "--model-size", "tiny"};
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), common.begin(), common.end());
    const auto r = train(args);
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    return r;
  };
  const auto saving =
      run({"--devices", "4", "--state-dict-type", "sharded", "--async-save", "--every-n-train-steps", "1",
           "--save-top-k", "-1", "--save-last", "--max-steps", "4", "--root", (dir_ / "a").string()});
  const fs::path v0 = dir_ / "a/lightning_logs/version_0/checkpoints";
  const std::set<std::string> all{"epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt", "epoch=0-step=3.ckpt",
                                  "epoch=0-step=4.ckpt", "last.ckpt"};
  EXPECT_EQ(names_in(v0), all);
  for (const std::string& name : all) {
    EXPECT_TRUE(fs::is_regular_file(v0 / name / ".metadata")) << name;
    EXPECT_TRUE(fs::is_regular_file(v0 / name / "meta.pt")) << name;
    EXPECT_NE(saving.output.find("committed sharded checkpoint " + (v0 / name).string()), std::string::npos)
        << name << "\n"
        << saving.output;
  }
  EXPECT_NE(saving.output.find("writing in the background"), std::string::npos) << saving.output;
  // meta.pt holds the loop counters of its own save, not of the later commit.
  EXPECT_EQ(
      torchfile::TorchFile::open((v0 / "epoch=0-step=2.ckpt/meta.pt").string())->root()->get("global_step")->as_int(),
      2);

  const auto resumed = run({"--devices", "4", "--state-dict-type", "full", "--max-steps", "6", "--root",
                            (dir_ / "a").string(), "--ckpt-path", "last"});
  EXPECT_NE(resumed.output.find("loaded sharded checkpoint " + (v0 / "last.ckpt").string() + " (global_step 4)"),
            std::string::npos)
      << resumed.output;
  const auto straight =
      run({"--devices", "4", "--state-dict-type", "full", "--max-steps", "6", "--root", (dir_ / "s").string()});
  const auto want = tensors_of(newest_checkpoint(dir_ / "s"));
  const auto got = tensors_of((dir_ / "a/lightning_logs/version_1/checkpoints/epoch=0-step=6.ckpt").string());
  ASSERT_EQ(want.size(), 67u * 2);
  for (const auto& [name, v] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_EQ(std::memcmp(v.data(), got.at(name).data(), v.size() * 4), 0) << name;
  }
  EXPECT_EQ(losses_of(resumed.output).at(6), losses_of(straight.output).at(6));

  const auto elastic =
      run({"--devices", "2", "--state-dict-type", "sharded", "--async-save", "--every-n-train-steps", "1",
           "--max-steps", "5", "--root", (dir_ / "e").string(), "--ckpt-path", (v0 / "epoch=0-step=2.ckpt").string()});
  EXPECT_NE(elastic.output.find("(global_step 2)"), std::string::npos) << elastic.output;
  const fs::path e0 = dir_ / "e/lightning_logs/version_0/checkpoints";
  EXPECT_EQ(names_in(e0), (std::set<std::string>{"epoch=0-step=5.ckpt"}));
  EXPECT_TRUE(fs::is_regular_file(e0 / "epoch=0-step=5.ckpt/meta.pt"));
  // Each removal comes after its successor's commit.
  for (int step = 3; step <= 4; ++step) {
    const std::string old = (e0 / fmt_step(step)).string(), next = (e0 / fmt_step(step + 1)).string();
    const std::size_t committed = elastic.output.find("committed sharded checkpoint " + next);
    const std::size_t removed = elastic.output.find("removed checkpoint " + old);
    EXPECT_NE(removed, std::string::npos) << elastic.output;
    EXPECT_LT(committed, removed) << elastic.output;
  }
  EXPECT_NEAR(losses_of(elastic.output).at(5), losses_of(straight.output).at(5), 2e-4);  // printed with 4 decimals
}

TEST_F(TrainProcessTest, TopKOnTrainLossKeepsTheBest) {
  const auto r = train({"--devices", "2", "--state-dict-type", "full", "--max-steps", "6", "--every-n-train-steps", "1",
                        "--monitor", "train_loss", "--save-top-k", "2", "--root", dir_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const auto losses = losses_of(r.output);
  ASSERT_EQ(losses.size(), 6u) << r.output;
  std::vector<std::pair<double, int>> ranked;
  for (const auto& [step, loss] : losses) ranked.emplace_back(loss, step);
  std::sort(ranked.begin(), ranked.end());
  const fs::path dir = dir_ / "lightning_logs/version_0/checkpoints";
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"epoch=0-step=" + std::to_string(ranked[0].second) + ".ckpt",
                                                  "epoch=0-step=" + std::to_string(ranked[1].second) + ".ckpt"}));
  const auto [key, state] =
      callback_of((dir / ("epoch=0-step=" + std::to_string(ranked[0].second) + ".ckpt")).string());
  EXPECT_EQ(key.rfind("ModelCheckpoint{'monitor': 'train_loss', 'mode': 'min', 'every_n_train_steps': 1,", 0), 0u)
      << key;
  EXPECT_EQ(state->get("monitor")->as_string(), "train_loss");
  EXPECT_EQ(state->get("best_k_models")->entries().size(), 2u);
}

TEST_F(TrainProcessTest, MaxEpochsWithAccumulationAndClipping) {
  // 186 items in batches of 64: 3 batches an epoch; 2 per step: 2 steps an epoch.
  const auto r = train({"--devices", "2", "--max-epochs", "2", "--global-batch", "64", "--accumulate-grad-batches", "2",
                        "--gradient-clip-val", "0.5", "--root", dir_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(losses_of(r.output).size(), 4u) << r.output;
  EXPECT_NE(r.output.find("step 4/4  epoch 1"), std::string::npos) << r.output;
  EXPECT_EQ(names_in(dir_ / "lightning_logs/version_0/checkpoints"), (std::set<std::string>{"epoch=1-step=4.ckpt"}));
}

TEST_F(TrainProcessTest, ObjectStoreRootAndCkptPath) {
  SP_REQUIRE_MOTO(moto);
  const std::string root = "s3://sp-test/train-process-" + std::to_string(::getpid());
  auto r = train({"--devices", "2", "--state-dict-type", "sharded", "--max-steps", "2", "--save-last", "--root", root});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string last = root + "/lightning_logs/version_0/checkpoints/last.ckpt";
  r = train({"--devices", "2", "--state-dict-type", "full", "--max-steps", "3", "--root", root, "--ckpt-path", "last"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.output.find("loaded sharded checkpoint " + last + " (global_step 2)"), std::string::npos) << r.output;
  auto st = storage::open_storage(root);
  EXPECT_TRUE(st->try_stat("lightning_logs/version_1/checkpoints/epoch=0-step=3.ckpt"));
  // An explicit URL works too, into a file of either format.
  r = train({"--devices", "2", "--max-steps", "4", "--root", root, "--ckpt-path",
             root + "/lightning_logs/version_1/checkpoints/epoch=0-step=3.ckpt"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.output.find("(global_step 3)"), std::string::npos) << r.output;
  st->remove_all();
}

TEST_F(TrainProcessTest, ResumesFromAConsolidatedFile) {
#ifndef SP_CLI_BIN
  GTEST_SKIP() << "built without the shardpoint command";
#else
  // `shardpoint consolidate` keys the optimizer state by FQN (as Lightning's consolidator
  // does); the trainer takes that as well as parameter ids.
  auto r = train({"--devices", "2", "--state-dict-type", "sharded", "--optimizer", "adam", "--max-steps", "2", "--root",
                  dir_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string file = (dir_ / "consolidated.ckpt").string();
  r = testing::run_process(
      {SP_CLI_BIN, "consolidate", (dir_ / "lightning_logs/version_0/checkpoints/epoch=0-step=2.ckpt").string(),
       "--output-file", file, "-q"},
      {}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  r = train(
      {"--devices", "2", "--optimizer", "adam", "--max-steps", "3", "--root", dir_.string(), "--ckpt-path", file});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.output.find("loaded full checkpoint " + file + " (global_step 2)"), std::string::npos) << r.output;
  const auto resumed = tensors_of((dir_ / "lightning_logs/version_1/checkpoints/epoch=0-step=3.ckpt").string());
  r = train({"--devices", "2", "--optimizer", "adam", "--max-steps", "3", "--root", (dir_ / "s").string()});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const auto straight = tensors_of((dir_ / "s/lightning_logs/version_0/checkpoints/epoch=0-step=3.ckpt").string());
  ASSERT_EQ(straight.size(), 67u * 4);  // params + exp_avg, exp_avg_sq, step
  for (const auto& [name, v] : straight) {
    ASSERT_TRUE(resumed.count(name)) << name;
    EXPECT_EQ(std::memcmp(v.data(), resumed.at(name).data(), v.size() * 4), 0) << name;
  }
#endif
}

TEST_F(TrainProcessTest, MpirunJoinsItsLaunch) {
#ifndef SP_MPIEXEC
  GTEST_SKIP() << "built without the MPI communicator";
#else
  auto r = testing::run_process({SP_MPIEXEC, "-np", "2", SP_TRAIN_BIN, "--state-dict-type", "sharded", "--max-steps",
                                 "2", "--root", dir_.string()},
                                testing::mpirun_root_env(), std::chrono::seconds(150));
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.output.find("2 ranks (mpi)"), std::string::npos) << r.output;
  const fs::path ckpt = dir_ / "lightning_logs/version_0/checkpoints/epoch=0-step=2.ckpt";
  EXPECT_TRUE(fs::is_regular_file(ckpt / "meta.pt"));
  EXPECT_TRUE(fs::is_regular_file(ckpt / "__1_0.distcp"));
  // --devices must agree with the launch: one message per rank, a non-zero exit, no hang.
  r = testing::run_process({SP_MPIEXEC, "-np", "2", SP_TRAIN_BIN, "--devices", "3", "--root", dir_.string()},
                           testing::mpirun_root_env(), std::chrono::seconds(150));
  EXPECT_NE(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.output.find("rank 0: --devices 3 does not match the launcher's world size 2"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 1: --devices 3"), std::string::npos) << r.output;
#endif
}

}  // namespace
}  // namespace shardpoint::train
