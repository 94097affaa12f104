// The kill -9 matrix (docs/durability.md): `shardpoint-train --devices 2` saving a sharded
// top-k checkpoint and last.ckpt at every step, the whole job killed with SIGKILL at each
// named point of a save (SHARDPOINT_TEST_KILL_AT, core/kill_point.h) while last.ckpt is being
// replaced, then at seeded random moments; synchronous and asynchronous saves, local disk.
// After every kill:
//   - every name in a checkpoints folder is a committed checkpoint (.metadata and meta.pt)
//     and verifies clean (engine::verify: structure, sidecar checksums, zip CRC-32s);
//   - the next run, started with --ckpt-path last, loads the checkpoint with the highest
//     global_step of the newest version folder that holds one (never starts from scratch
//     while one exists) and says so in one "note:" line when that is not a last*.ckpt;
//   - what the killed save left (hidden staging folders, temporary files) is gone after
//     the next run's first save, and never more than one save's worth accumulates.
// The runs form one chain per mode: each run resumes from the previous one's checkpoints
// and is itself killed at the next point, so N kill points cost N + 1 runs. On an s3://
// root (moto), where saves rewrite in place, two kills while last.ckpt is rewritten check
// that the resume takes the newest committed checkpoint and never the half-written one.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "launch_ranks.h"
#include "shardpoint/location.h"
#include "shardpoint/storage.h"
#include "shardpoint/storage_registry.h"
#include "shardpoint/verify.h"
#include "storage/s3_servers.h"
#include "test_util.h"
#include "torchfile/torch_file.h"

namespace shardpoint::train {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The kill points of the matrix, each at the 4th time the point is reached: saves 1-2 are
// step 1's top-k checkpoint and last.ckpt, save 3 step 2's top-k one, save 4 the rewrite of
// last.ckpt at step 2 (the issue's case). remove_old is reached only when a committed
// folder is replaced: the first time is save 4.
const std::vector<std::string> kKillPoints = {"plan@4",     "data:1@4",  "sidecar@4", "index@4",
                                              "metadata@4", "meta_pt@4", "publish@4", "remove_old@1"};
// Points a seeded random kill picks from (every save reaches them: plan and data on every
// rank, the others on rank 0).
const std::vector<std::string> kRandomPoints = {"plan", "data", "sidecar", "index", "metadata"};
constexpr int kRandomKills = 1;  // per mode: one at a random point, one at a random moment

// What a root holds after a run.
struct RootState {
  std::int64_t newest_step = -1;    // of the newest version folder holding a committed checkpoint; -1: none
  std::set<std::string> committed;  // paths
  std::set<std::string> hidden;     // staging folders and temporary files
  int verified = 0;
};

std::int64_t global_step_of(const fs::path& meta) {
  return torchfile::TorchFile::open(meta.string())->root()->get("global_step")->as_int();
}

// Checks the invariants on every name under root's checkpoints folders (gtest failures) and
// returns what it found.
// Checkpoints already verified, by path and folder inode (a replaced folder has a new one).
using VerifiedSet = std::set<std::pair<std::string, ino_t>>;

RootState inspect_root(const fs::path& root, VerifiedSet& verified) {
  RootState state;
  if (!fs::is_directory(root / "lightning_logs")) return state;
  int newest_version = -1;
  for (const auto& v : fs::directory_iterator(root / "lightning_logs")) {
    const int version = std::stoi(v.path().filename().string().substr(8));
    if (!fs::is_directory(v.path() / "checkpoints")) continue;
    for (const auto& e : fs::directory_iterator(v.path() / "checkpoints")) {
      const std::string name = e.path().filename().string();
      if (name.front() == '.' || name.find(".sp-tmp.") != std::string::npos) {
        state.hidden.insert(e.path().string());
        continue;
      }
      const bool committed = fs::is_regular_file(e.path() / ".metadata") && fs::is_regular_file(e.path() / "meta.pt");
      EXPECT_TRUE(committed) << e.path() << ": a checkpoint name holds an uncommitted folder";
      if (!committed) continue;
      struct stat st {};
      EXPECT_EQ(::stat(e.path().c_str(), &st), 0) << e.path();
      if (!verified.count({e.path().string(), st.st_ino})) {
        const engine::VerifyReport report = engine::verify(e.path().string());
        EXPECT_TRUE(report.ok()) << e.path() << ": " << (report.ok() ? "" : report.problems.front().message);
        if (report.ok()) {
          ++state.verified;
          verified.insert({e.path().string(), st.st_ino});
        }
      }
      state.committed.insert(e.path().string());
      const std::int64_t step = global_step_of(e.path() / "meta.pt");
      if (version > newest_version || (version == newest_version && step > state.newest_step)) {
        newest_version = version;
        state.newest_step = step;
      }
    }
  }
  return state;
}

struct TrainRun {
  comm::ProcessResult result;
  bool killed = false;
};

// One shardpoint-train job in its own process group (so a kill point's SIGKILL takes the
// launcher and both ranks, and nothing else); killed as a whole after `timeout`.
TrainRun train(const fs::path& root, bool async, std::int64_t max_steps, bool resume, const std::string& kill_at,
               std::chrono::milliseconds timeout) {
  std::vector<std::string> argv{SP_TRAIN_BIN,
                                "--devices",
                                "2",
                                "--state-dict-type",
                                "sharded",
                                "--every-n-train-steps",
                                "1",
                                "--save-last",
                                "--model-size",
                                "tiny",
                                "--max-steps",
                                std::to_string(max_steps),
                                "--root",
                                root.string()};
  if (async) argv.push_back("--async-save");
  if (resume) argv.insert(argv.end(), {"--ckpt-path", "last"});
  comm::EnvVars env;
  if (!kill_at.empty()) env.emplace_back("SHARDPOINT_TEST_KILL_AT", kill_at);
  TrainRun run;
  run.result = testing::run_process(argv, env, timeout);
  run.killed = run.result.signal == SIGKILL;
  return run;
}

// The matrix's counts, printed at the end (docs/durability.md quotes them).
struct Counts {
  int runs = 0, killed = 0, killed_before_resume = 0, verified = 0, resumes = 0, resumes_correct = 0, notes = 0;
  int leftovers_removed = 0;
};

// Checks a run that resumed with --ckpt-path last from `before` (the root's state when it
// started): what it loaded, its note, and that the leftovers it found are gone.
void check_resume(const TrainRun& run, const RootState& before, const RootState& after, Counts& counts) {
  const std::string& out = run.result.output;
  static const std::regex kLoaded(R"(loaded sharded checkpoint (\S+) \(global_step (\d+)\))");
  std::smatch m;
  const bool chose = out.find("loaded sharded checkpoint") != std::string::npos ||
                     out.find("No checkpoint will be loaded") != std::string::npos;
  if (run.killed && !chose) {
    ++counts.killed_before_resume;  // a random kill during start-up: nothing to check yet
    return;
  }
  ++counts.resumes;
  if (before.newest_step < 0) {
    EXPECT_NE(out.find("No checkpoint will be loaded"), std::string::npos) << out;
    counts.resumes_correct += out.find("No checkpoint will be loaded") != std::string::npos;
  } else {
    ASSERT_TRUE(std::regex_search(out, m, kLoaded))
        << "resumed from scratch although a checkpoint of step " << before.newest_step << " was committed:\n"
        << out;
    const std::string path = m[1].str();
    const bool right = std::stoll(m[2].str()) == before.newest_step && before.committed.count(path) > 0;
    EXPECT_TRUE(right) << "loaded " << path << " at global_step " << m[2].str() << ", the newest committed is step "
                       << before.newest_step << ":\n"
                       << out;
    counts.resumes_correct += right;
    const bool is_last = fs::path(path).filename().string().rfind("last", 0) == 0;
    static const std::regex kNote("note: --ckpt-path last");
    const auto notes = std::distance(std::sregex_iterator(out.begin(), out.end(), kNote), std::sregex_iterator());
    EXPECT_EQ(notes, is_last ? 0 : 1) << out;
    counts.notes += static_cast<int>(notes);
  }
  // Whatever the killed save left is removed by this run's first save (every run here
  // saves at least twice before its own kill point).
  if (run.killed && out.find("saved sharded checkpoint") == std::string::npos) return;
  for (const std::string& h : before.hidden) {
    EXPECT_FALSE(after.hidden.count(h)) << h << " (left by a killed save) survived the next run:\n" << out;
    counts.leftovers_removed += after.hidden.count(h) == 0;
  }
}

class TrainKillTest : public ::testing::TestWithParam<bool> {
 protected:
  fs::path dir_ = fs::temp_directory_path() /
                  ("sp_train_kill_test_" + std::to_string(::getpid()) + (GetParam() ? "_async" : "_sync"));
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
};

TEST_P(TrainKillTest, EveryKillPointThenRandomKillsLoseNothingCommitted) {
  const bool async = GetParam();
  Counts counts;
  RootState state;
  VerifiedSet verified;
  double full_run_seconds = 0;  // of the last run that reached its end or its last kill point
  std::mt19937 rng(15);         // the issue's number: the same random moments in every run of the test
  auto one_run = [&](const std::string& kill_at, std::chrono::milliseconds timeout, bool expect_kill) {
    const bool resume = counts.runs > 0;
    const std::int64_t start = std::max<std::int64_t>(state.newest_step, 0);
    const TrainRun run = train(dir_, async, start + 2, resume, kill_at, timeout);
    ++counts.runs;
    SCOPED_TRACE("run " + std::to_string(counts.runs) + " kill " + (kill_at.empty() ? "random" : kill_at));
    if (expect_kill) {
      EXPECT_TRUE(run.killed) << "the kill point did not fire:\n" << run.result.describe();
    } else if (!run.killed && !run.result.timed_out) {
      EXPECT_EQ(run.result.exit_code, 0) << run.result.describe();
    }
    counts.killed += run.killed || run.result.timed_out;
    if (expect_kill || !run.killed) full_run_seconds = run.result.seconds;
    const RootState after = inspect_root(dir_, verified);
    counts.verified += after.verified;
    if (resume) check_resume(run, state, after, counts);
    // At most one save's leftovers: a staging folder (or the replaced folder not yet removed).
    EXPECT_LE(after.hidden.size(), 1u) << run.result.output;
    state = after;
  };
  for (const std::string& kill_at : kKillPoints) one_run(kill_at, 120s, true);
  // Random kills: a seeded point, rank and save (1-4), then a seeded moment late in a run
  // (start-up, three LibTorch processes, is most of a run's length; the saves are late).
  std::uniform_int_distribution<std::size_t> point(0, kRandomPoints.size() - 1);
  std::uniform_int_distribution<int> rank(0, 1), save(1, 4);
  std::uniform_real_distribution<double> fraction(0.75, 1.0);
  for (int i = 0; i < kRandomKills; ++i) {
    const std::string& name = kRandomPoints[point(rng)];
    const int r = rank(rng);  // drawn for every point, so the sequence does not depend on the name
    const bool every_rank = name == "plan" || name == "data";  // the others run on rank 0 only
    const std::string at = name + (every_rank ? ":" + std::to_string(r) : "") + "@" + std::to_string(save(rng));
    one_run(at, 120s, false);
    one_run("", std::chrono::milliseconds(static_cast<long>(1000 * full_run_seconds * fraction(rng))), false);
  }
  one_run("", 120s, false);  // the last resume, to the end: leaves nothing behind
  EXPECT_TRUE(state.hidden.empty());
  EXPECT_EQ(counts.resumes_correct, counts.resumes);
  std::printf("kill matrix (%s saves, local disk): %zu kill points + %d random kills, %d runs, %d killed (%d before "
              "resuming), %d checkpoints verified, %d/%d resumes correct, %d fallback notes, %d leftovers "
              "removed\n",
              async ? "async" : "sync", kKillPoints.size(), 2 * kRandomKills, counts.runs, counts.killed,
              counts.killed_before_resume, counts.verified, counts.resumes_correct, counts.resumes, counts.notes,
              counts.leftovers_removed);
}

// An s3:// root (moto): object stores cannot swap folders, so a save rewrites in place after
// un-committing the old checkpoint (docs/durability.md §5). A kill while last.ckpt is
// rewritten (sync: before meta.pt; async: rank 1's data write) leaves it uncommitted; the
// next run resumes from the newest committed checkpoint (the top-k one of the same step),
// says so, and never loads the uncommitted one. Every committed checkpoint verifies.
TEST(TrainKillObjectStoreTest, KillDuringLastRewriteResumesFromTheNewestCommitted) {
  SP_REQUIRE_MOTO(moto);
  const std::string root = "s3://sp-test/train-kill-" + std::to_string(::getpid());
  auto st = storage::open_storage(root);
  // name -> (committed, global_step) of every checkpoint under the root
  auto inspect = [&] {
    std::map<std::string, std::set<std::string>> files;
    static const std::regex kKey(R"((lightning_logs/version_\d+/checkpoints/[^/]+\.ckpt)/(.*))");
    for (const auto& o : st->list("lightning_logs/")) {
      std::smatch m;
      if (std::regex_match(o.key, m, kKey)) files[m[1].str()].insert(m[2].str());
    }
    std::map<std::string, std::int64_t> committed;  // url -> global_step
    for (const auto& [key, names] : files) {
      if (!names.count(".metadata") || !names.count("meta.pt")) continue;
      const std::string url = Location::parse(root).child(key).to_string();
      const engine::VerifyReport report = engine::verify(url);
      EXPECT_TRUE(report.ok()) << url << ": " << (report.ok() ? "" : report.problems.front().message);
      committed[url] =
          torchfile::TorchFile::open(st->open_source(key + "/meta.pt"))->root()->get("global_step")->as_int();
    }
    return committed;
  };
  auto run = [&](bool async, std::int64_t max_steps, bool resume, const std::string& kill_at) {
    return train(root, async, max_steps, resume, kill_at, 120s).result;
  };
  const std::string checkpoints = root + "/lightning_logs/version_";
  auto r = run(false, 2, false, "meta_pt@4");
  ASSERT_EQ(r.signal, SIGKILL) << r.describe();
  auto committed = inspect();
  EXPECT_FALSE(committed.count(checkpoints + "0/checkpoints/last.ckpt"));  // rewritten in place, uncommitted
  ASSERT_EQ(committed.at(checkpoints + "0/checkpoints/epoch=0-step=2.ckpt"), 2);
  r = run(true, 4, true, "data:1@4");
  ASSERT_EQ(r.signal, SIGKILL) << r.describe();
  EXPECT_NE(
      r.output.find("loaded sharded checkpoint " + checkpoints + "0/checkpoints/epoch=0-step=2.ckpt (global_step 2)"),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("note: --ckpt-path last: " + checkpoints + "0/checkpoints/last.ckpt is not committed"),
            std::string::npos)
      << r.output;
  committed = inspect();
  EXPECT_FALSE(committed.count(checkpoints + "1/checkpoints/last.ckpt"));
  ASSERT_EQ(committed.at(checkpoints + "1/checkpoints/epoch=0-step=4.ckpt"), 4);
  r = run(true, 5, true, "");
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_NE(r.output.find("note: --ckpt-path last: " + checkpoints + "1/checkpoints/last.ckpt is not committed"),
            std::string::npos)
      << r.output;
  EXPECT_NE(
      r.output.find("loaded sharded checkpoint " + checkpoints + "1/checkpoints/epoch=0-step=4.ckpt (global_step 4)"),
      std::string::npos)
      << r.output;
  committed = inspect();
  EXPECT_EQ(committed.at(checkpoints + "2/checkpoints/last.ckpt"), 5);
  std::printf("kill matrix (object store, s3 on moto): 2 kill points (sync meta_pt, async data:1), 3 runs, 2 killed, "
              "%zu committed checkpoints at the end (all verified after every run), 2/2 resumes correct, 2 fallback "
              "notes\n",
              committed.size());
  st->remove_all();
}

INSTANTIATE_TEST_SUITE_P(SaveModes, TrainKillTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Async" : "Sync"; });

}  // namespace
}  // namespace shardpoint::train
