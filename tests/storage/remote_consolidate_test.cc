// `shardpoint consolidate` from and to object stores, end to end (the built binary) against
// real servers on 127.0.0.1: moto and s3s-fs (s3://, signature checking on), fake-gcs-server
// (gs:// on the JSON API) and Azurite (az://).
//   - s3:// -> local, local -> s3://, s3:// -> s3:// give the bytes of local -> local (the
//     local result loads in PyTorch 1.13); sharded safetensors to s3:// equal the local
//     folder object by object, index last;
//   - az:// and gs:// (JSON API) -> local and local -> az:// / gs:// equal local -> local;
//   - Lightning's checks worded for a prefix (no objects, an object instead of a prefix, no
//     meta.pt, output object exists): one line, exit 1;
//   - an upload that fails after its first parts (a corrupt blob later in the checkpoint;
//     moto's log shows 6 parts, then the abort), or is stopped by SIGTERM, leaves no object
//     at the output key and no multipart upload;
//   - a wrong secret: one error line without the secret, exit 1;
//   - peak RSS of s3:// -> s3:// under --memory-budget;
//   - the engine API over memory:// (no server) equals local outputs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "azure_test_util.h"
#include "comm/thread_communicator.h"
#include "core/byte_stream.h"
#include "engine/checkpoint_test_state.h"
#include "engine/chunking.h"
#include "engine/torch_save.h"
#include "fake_gcs_server.h"
#include "s3_servers.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/consolidate.h"
#include "shardpoint/error.h"
#include "shardpoint/metadata.h"
#include "shardpoint/storage_registry.h"
#include "storage/local_storage.h"
#include "storage_test_util.h"
#include "test_util.h"

namespace shardpoint {
namespace {

namespace fs = std::filesystem;
using shardpoint::testing::line_count;
using shardpoint::testing::run_command;
using shardpoint::testing::shell_quote;
using shardpoint::testing::TempDir;
using storage::testing::copy_objects;
using storage::testing::read_all;
using storage::testing::s3_server_kinds;

const std::string kTool = SP_SHARDPOINT;

std::string unique_prefix(const std::string& name) {
  return "s3://sp-test/" + testing::unique_name("consolidate-" + name);
}

struct ToolRun {
  int code = -1;
  std::string out;  // stdout + stderr
};

ToolRun tool(const std::string& args, const std::string& env = "") {
  auto r = run_command(env + " " + shell_quote(kTool) + " " + args + " 2>&1");
  return ToolRun{r.exit_code, r.output};
}

void write_meta_pt(storage::Storage& st) {
  using pickle::Value;
  engine::StateNode root{engine::StateDict{}};
  root.set("epoch", engine::StateNode(Value::integer(1)));
  root.set("global_step", engine::StateNode(Value::integer(3)));
  root.set("pytorch-lightning_version", engine::StateNode(Value::str("2.6.0")));
  StringSink sink;
  engine::write_torch_save(root, sink, engine::TorchSaveFileOptions{"meta"});
  st.write_atomic("meta.pt", as_bytes(sink.str()));
}

// The engine test state on 2 ranks ("optim" renamed "optimizer_0") + meta.pt, in st.
void save_small(storage::Storage& st) {
  std::vector<engine::testing::RankState> states;
  for (int r = 0; r < 2; ++r) {
    states.push_back(engine::testing::make_rank_state(r, 2, true));
    for (auto& [k, v] : states.back().root.dict()) {
      if (k == "optim") k = "optimizer_0";
    }
  }
  comm::ThreadGroup group(2);
  group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, st, comm); });
  write_meta_pt(st);
}

// model.a: `mib` MiB of float32 [rows, 1024] sharded along dim 1 over 4 ranks; model.b:
// 256 KiB after it in key order. + meta.pt.
void save_large(storage::Storage& st, int mib) {
  const std::int64_t rows = std::int64_t{mib} * 256;
  const int world = 4;
  std::vector<std::vector<float>> a(world), b(world);
  std::vector<engine::StateNode> roots(world);
  for (int r = 0; r < world; ++r) {
    engine::Box box = engine::shard_box({rows, 1024}, {world}, {engine::Placement::shard(1)}, {r});
    a[r].resize(static_cast<std::size_t>(engine::volume(box.sizes)));
    for (std::size_t i = 0; i < a[r].size(); ++i) a[r][i] = static_cast<float>(i % 1000) + static_cast<float>(r);
    engine::Box small = engine::shard_box({64, 1024}, {world}, {engine::Placement::shard(1)}, {r});
    b[r].assign(static_cast<std::size_t>(engine::volume(small.sizes)), 2.5f);
    engine::StateDict model;
    model.emplace_back(
        "a",
        engine::StateNode(engine::TensorShard{
            DType::kFloat32, {rows, 1024}, box.offsets, box.sizes, std::as_writable_bytes(std::span<float>(a[r]))}));
    model.emplace_back(
        "b",
        engine::StateNode(engine::TensorShard{
            DType::kFloat32, {64, 1024}, small.offsets, small.sizes, std::as_writable_bytes(std::span<float>(b[r]))}));
    roots[r] = engine::StateNode(engine::StateDict{});
    roots[r].set("model", engine::StateNode(std::move(model)));
  }
  comm::ThreadGroup group(world);
  group.run([&](comm::Communicator& comm) { engine::save(roots[comm.rank()], st, comm); });
  write_meta_pt(st);
}

// The object a URL names.
std::string read_object(const std::string& url) {
  auto slash = url.find_last_of('/');
  return read_all(*storage::open_storage(url.substr(0, slash)), url.substr(slash + 1));
}

// The small checkpoint saved locally and copied to <remote>/ckpt, then consolidated
// local -> local (dir/a), remote -> local (dir/b) and local -> remote (<remote>/c): the three
// outputs are equal. `want`: the local -> local bytes. Callers check HasFatalFailure().
void consolidate_both_ways(TempDir& dir, const std::string& remote, const std::string& scheme, std::string& want) {
  const std::string local = dir.file("ckpt");
  save_small(*storage::open_local_storage_at(local));
  copy_objects(*storage::open_local_storage_at(local), *storage::open_storage(remote + "/ckpt"));
  fs::create_directories(dir.file("a"));
  fs::create_directories(dir.file("b"));
  ToolRun r = tool("consolidate " + shell_quote(local) + " --output_file " + shell_quote(dir.file("a/out.pt")));
  ASSERT_EQ(r.code, 0) << r.out;
  r = tool("consolidate " + shell_quote(remote + "/ckpt") + " --output_file " + shell_quote(dir.file("b/out.pt")));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "");
  r = tool("consolidate " + shell_quote(local) + " --output_file " + shell_quote(remote + "/c/out.pt"));
  ASSERT_EQ(r.code, 0) << r.out;
  want = testing::read_text(dir.file("a/out.pt"));
  ASSERT_GT(want.size(), 1000u);
  EXPECT_TRUE(testing::read_text(dir.file("b/out.pt")) == want) << scheme << " -> local differs from local -> local";
  EXPECT_TRUE(read_object(remote + "/c/out.pt") == want) << "local -> " << scheme << " differs from local -> local";
}

// The s3:// cases on each S3 server (s3_servers.h): moto and s3s-fs.
class RemoteConsolidateS3Test : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(S3, RemoteConsolidateS3Test, s3_server_kinds(), storage::testing::S3ServerKindName());

TEST_P(RemoteConsolidateS3Test, S3BothWaysEqualsLocalToLocal) {
  SP_REQUIRE_S3(server, GetParam());
  TempDir dir;
  const std::string prefix = unique_prefix("both");
  std::string want;
  consolidate_both_ways(dir, prefix, "s3", want);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ToolRun r =
      tool("consolidate " + shell_quote(prefix + "/ckpt") + " --output_file " + shell_quote(prefix + "/d/out.pt"));
  ASSERT_EQ(r.code, 0) << r.out;
  // Default output: "<prefix>.consolidated" next to the prefix.
  r = tool("consolidate " + shell_quote(prefix + "/ckpt/"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(read_object(prefix + "/d/out.pt") == want) << "s3 -> s3 differs from local -> local";
  EXPECT_GT(storage::open_storage(prefix)->stat("ckpt.consolidated"), 1000u);
  EXPECT_EQ(open_uploads(*server, "sp-test"), 0);

  // The s3 -> local result loads in PyTorch 1.13, with Lightning's layout.
  if (run_command("/usr/bin/python3 -c 'import torch' 2>/dev/null").exit_code == 0) {
    auto load = run_command("/usr/bin/python3 -c \"import sys, torch; c = torch.load(sys.argv[1]); "
                            "print(sorted(c), sorted(c['state_dict'])[:1], len(c['optimizer_states']))\" " +
                            shell_quote(dir.file("b/out.pt")) + " 2>&1");
    EXPECT_EQ(load.exit_code, 0) << load.output;
    EXPECT_NE(load.output.find("'state_dict'"), std::string::npos) << load.output;
    EXPECT_NE(load.output.find("'optimizer_states'"), std::string::npos) << load.output;
    EXPECT_NE(load.output.find("'global_step'"), std::string::npos) << load.output;
  } else if (testing::oracles_required()) {
    ADD_FAILURE() << "oracle missing: /usr/bin/python3 with torch (python3-torch)";
  }
}

TEST_P(RemoteConsolidateS3Test, ShardedSafetensorsToS3EqualLocalFolder) {
  SP_REQUIRE_S3(server, GetParam());
  TempDir dir;
  const std::string local = dir.file("ckpt");
  save_small(*storage::open_local_storage_at(local));
  const std::string prefix = unique_prefix("st");
  ToolRun r = tool("consolidate " + shell_quote(local) + " --to safetensors --max-shard-size 200B --output_file " +
                   shell_quote(dir.file("hf")));
  ASSERT_EQ(r.code, 0) << r.out;
  r = tool("consolidate " + shell_quote(local) + " --to safetensors --max-shard-size 200B --output_file " +
           shell_quote(prefix + "/hf"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto remote = storage::open_storage(prefix + "/hf");
  std::vector<std::string> local_names, remote_names;
  for (const auto& e : fs::directory_iterator(dir.file("hf"))) local_names.push_back(e.path().filename().string());
  std::sort(local_names.begin(), local_names.end());
  for (const auto& o : remote->list("")) remote_names.push_back(o.key);
  EXPECT_EQ(remote_names, local_names);
  EXPECT_GT(remote_names.size(), 2u);
  for (const std::string& name : local_names) {
    EXPECT_TRUE(read_all(*remote, name) == testing::read_text(dir.file("hf/" + name))) << name;
  }
  // A second run finds the output prefix taken (s3s-fs refuses it too, but its HEAD on the
  // prefix, a folder there, answers 500 before the check can name it).
  r = tool("consolidate " + shell_quote(local) + " --to safetensors --max-shard-size 200B --output_file " +
           shell_quote(prefix + "/hf"));
  EXPECT_EQ(r.code, 1);
  if (GetParam() != "s3s_fs") {
    EXPECT_NE(r.out.find("already exists"), std::string::npos) << r.out;
  }
}

TEST_P(RemoteConsolidateS3Test, LightningChecksWordedForAPrefix) {
  SP_REQUIRE_S3(server, GetParam());
  const std::string prefix = unique_prefix("checks");
  ToolRun r = tool("consolidate " + shell_quote(prefix + "/missing"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "shardpoint: The provided checkpoint folder does not exist: there are no objects under " + prefix +
                       "/missing\n");

  storage::open_storage(prefix)->write_atomic("object", as_bytes(std::string("x")));
  r = tool("consolidate " + shell_quote(prefix + "/object"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "shardpoint: The provided checkpoint path must be a folder, containing the checkpoint shards: " +
                       prefix + "/object is an object, not a prefix with objects under it\n");

  auto ckpt = storage::open_storage(prefix + "/ckpt");
  save_small(*ckpt);
  ckpt->remove("meta.pt");
  r = tool("consolidate " + shell_quote(prefix + "/ckpt"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out,
            "shardpoint: Only FSDP-sharded checkpoints saved with Lightning are supported for consolidation. The "
            "provided folder is not in that format (no meta.pt under it): " +
                prefix + "/ckpt\n");

  // --layout dcp needs no meta.pt; the output object then exists.
  r = tool("consolidate " + shell_quote(prefix + "/ckpt") + " --layout dcp --output_file " +
           shell_quote(prefix + "/object"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out,
            "shardpoint: The path for the converted checkpoint already exists. Choose a different path by providing "
            "`--output_file` or move/delete the object first: " +
                prefix + "/object\n");
  r = tool("consolidate " + shell_quote(prefix + "/ckpt") + " --layout dcp --output_file s3://sp-test");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(line_count(r.out), 1u) << r.out;
  r = tool("consolidate " + shell_quote(prefix + "/ckpt") + " --layout dcp --output_file " +
           shell_quote(prefix + "/out.pt"));
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST_P(RemoteConsolidateS3Test, FailedUploadLeavesNoObjectAndNoUpload) {
  SP_REQUIRE_S3(server, GetParam());
  const std::string prefix = unique_prefix("failed");
  auto ckpt = storage::open_storage(prefix + "/ckpt");
  save_large(*ckpt, 32);
  // Corrupt model.b (read after model.a's 32 MiB were uploaded in parts): a byte in the
  // middle of one of its blobs, which the checksum sidecar catches.
  format::Metadata md = engine::read_metadata(*ckpt);
  const format::StorageInfo* victim = nullptr;
  for (const auto& [index, info] : md.storage_data) {
    if (index.fqn == "model.b") victim = &info;
  }
  ASSERT_NE(victim, nullptr);
  std::string file = read_all(*ckpt, victim->relative_path);
  file[victim->offset + victim->length / 2] ^= 0x5a;
  ckpt->write_atomic(victim->relative_path, as_bytes(file));

  // A small budget: one reader, small buffers, so model.a is being uploaded when model.b fails.
  ToolRun r = tool("consolidate " + shell_quote(prefix + "/ckpt") +
                   " --layout fabric --memory-budget 40MiB --output_file " + shell_quote(prefix + "/out.pt"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(line_count(r.out), 1u) << r.out;
  EXPECT_NE(r.out.find("model.b"), std::string::npos) << r.out;
  EXPECT_FALSE(storage::open_storage(prefix)->try_stat("out.pt"));
  EXPECT_EQ(open_uploads(*server, "sp-test"), 0);
}

// gs:// on GCS's JSON API (resumable uploads), served by fake-gcs-server.
TEST(RemoteConsolidateTest, GcsJsonBothWaysEqualsLocalToLocal) {
  SP_REQUIRE_FAKE_GCS(server);
  TempDir dir;
  const std::string prefix = "gs://sp-gcs-json/" + testing::unique_name("consolidate-json");
  std::string want;
  consolidate_both_ways(dir, prefix, "gs", want);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ToolRun r =
      tool("consolidate " + shell_quote(prefix + "/ckpt") + " --output_file " + shell_quote(prefix + "/d/out.pt"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(read_object(prefix + "/d/out.pt") == want) << "gs -> gs differs from local -> local";
}

// SIGTERM once the multipart upload has begun (moto's request log shows its POST ?uploads):
// exit 143, the upload aborted, no object. moto only: it watches moto's request log.
TEST(RemoteConsolidateTest, SigtermMidUploadLeavesNoObjectAndNoUpload) {
  SP_REQUIRE_MOTO(moto);
  const std::string prefix = unique_prefix("sigterm");
  save_large(*storage::open_storage(prefix + "/ckpt"), 32);
  const std::string in = prefix + "/ckpt", out = prefix + "/out.pt";
  const std::string log =
      "/tmp/shardpoint-moto-" + std::to_string(::getpid()) + "-" + std::to_string(moto->port()) + ".log";
  const std::string started = out.substr(std::string("s3://").size()) + "?uploads=";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(kTool.c_str(), kTool.c_str(), "consolidate", in.c_str(), "--layout", "fabric", "--output_file", out.c_str(),
            "--memory-budget", "40MiB", "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  bool seen = false;
  for (int i = 0; i < 30000 && !seen; ++i) {
    seen = testing::read_text(log).find(started) != std::string::npos;
    if (!seen) ::usleep(1000);
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 0) GTEST_SKIP() << "the copy finished before SIGTERM arrived";
  EXPECT_TRUE(seen) << "no multipart upload seen in " << log;
  EXPECT_EQ(WEXITSTATUS(status), 143);
  EXPECT_FALSE(storage::open_storage(prefix)->try_stat("out.pt"));
  EXPECT_EQ(open_uploads(*moto, "sp-test"), 0);
}

TEST_P(RemoteConsolidateS3Test, WrongSecretIsOneLineWithoutTheSecret) {
  SP_REQUIRE_S3(server, GetParam());
  TempDir dir;
  const std::string prefix = unique_prefix("secret");
  save_small(*storage::open_storage(prefix + "/ckpt"));
  const std::string secret = "Wr0ngS3cretWr0ngS3cretWr0ngS3cret0000000";
  const std::string env = "AWS_SECRET_ACCESS_KEY=" + secret;
  ToolRun r =
      tool("consolidate " + shell_quote(prefix + "/ckpt") + " --output_file " + shell_quote(dir.file("out.pt")), env);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(line_count(r.out), 1u) << r.out;
  EXPECT_EQ(r.out.rfind("shardpoint: ", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find(secret), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir.file("out.pt")));

  save_small(*storage::open_local_storage_at(dir.file("local")));
  r = tool("consolidate " + shell_quote(dir.file("local")) + " --output_file " + shell_quote(prefix + "/out.pt"), env);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(line_count(r.out), 1u) << r.out;
  EXPECT_EQ(r.out.find(secret), std::string::npos) << r.out;
  EXPECT_FALSE(storage::open_storage(prefix)->try_stat("out.pt"));
}

// Peak RSS of the whole process (wait4's ru_maxrss) for s3:// -> s3:// of a 48 MiB
// checkpoint with --memory-budget 64MiB.
TEST_P(RemoteConsolidateS3Test, PeakRssUnderBudgetS3ToS3) {
  SP_REQUIRE_S3(server, GetParam());
  const std::string prefix = unique_prefix("rss");
  save_large(*storage::open_storage(prefix + "/ckpt"), 48);
  const std::string in = prefix + "/ckpt", out = prefix + "/out.pt";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(kTool.c_str(), kTool.c_str(), "consolidate", in.c_str(), "--output_file", out.c_str(), "--memory-budget",
            "64MiB", "--quiet", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(::wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_GT(storage::open_storage(prefix)->stat("out.pt"), std::uint64_t{48} << 20);
  std::printf("consolidate s3 -> s3, 48 MiB, --memory-budget 64MiB: peak RSS %.1f MiB\n", ru.ru_maxrss / 1024.0);
  EXPECT_LT(ru.ru_maxrss, 64 * 1024);
}

// The engine API with memory:// on both sides (no server): torch.save and sharded
// safetensors equal the local outputs; the output prefix taken is refused.
TEST(RemoteConsolidateTest, EngineMemoryUrlsEqualLocal) {
  TempDir dir;
  const std::string local = dir.file("ckpt");
  save_small(*storage::open_local_storage_at(local));
  const std::string mem = "memory://consolidate-" + std::to_string(::getpid());
  copy_objects(*storage::open_local_storage_at(local), *storage::open_storage(mem + "/ckpt"));

  engine::ConsolidateOptions o;
  o.checkpoint_folder = Location::parse(local);
  o.output_file = Location::parse(dir.file("out.pt"));
  engine::consolidate(o);
  o.checkpoint_folder = Location::parse(mem + "/ckpt");
  o.output_file = Location::parse(mem + "/out/out.pt");
  engine::ConsolidateReport report = engine::consolidate(o);
  EXPECT_EQ(report.output.to_string(), mem + "/out/out.pt");
  EXPECT_TRUE(read_object(mem + "/out/out.pt") == testing::read_text(dir.file("out.pt")));
  EXPECT_THROW(engine::consolidate(o), PlanError);  // the output object exists now

  o.format = engine::ConsolidateFormat::kSafetensors;
  o.max_shard_bytes = 200;
  o.checkpoint_folder = Location::parse(local);
  o.output_file = Location::parse(dir.file("hf"));
  engine::consolidate(o);
  o.checkpoint_folder = Location::parse(mem + "/ckpt");
  o.output_file = Location::parse(mem + "/hf");
  engine::consolidate(o);
  auto hf = storage::open_storage(mem + "/hf");
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir.file("hf"))) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(read_all(*hf, name) == testing::read_text(e.path().string())) << name;
    ++n;
  }
  EXPECT_EQ(hf->list("").size(), n);
  EXPECT_THROW(engine::consolidate(o), PlanError);  // objects under the output prefix
}

// Tiny slab buffers (rows of a [3, 4, 50000] tensor larger than a buffer: boxes cut along
// dims 1 and 2; a 0-dim and an empty tensor) give the bytes of one box per tensor, from a
// local folder and from memory://.
TEST(RemoteConsolidateTest, TinyBuffersCutBoxesLikeWholeTensors) {
  TempDir dir;
  const std::string local = dir.file("ckpt");
  {
    const int world = 2;
    std::vector<std::vector<float>> big(world);
    std::vector<float> scalar{3.5f};
    std::vector<engine::StateNode> roots(world);
    for (int r = 0; r < world; ++r) {
      engine::Box box = engine::shard_box({3, 4, 50000}, {world}, {engine::Placement::shard(2)}, {r});
      big[r].resize(static_cast<std::size_t>(engine::volume(box.sizes)));
      for (std::size_t i = 0; i < big[r].size(); ++i) big[r][i] = static_cast<float>(i) * 0.25f + static_cast<float>(r);
      engine::StateDict model;
      model.emplace_back("big",
                         engine::StateNode(engine::TensorShard{DType::kFloat32,
                                                               {3, 4, 50000},
                                                               box.offsets,
                                                               box.sizes,
                                                               std::as_writable_bytes(std::span<float>(big[r]))}));
      model.emplace_back("scalar", engine::StateNode(engine::TensorShard{
                                       DType::kFloat32, {}, {}, {}, std::as_writable_bytes(std::span<float>(scalar))}));
      model.emplace_back("empty", engine::StateNode(engine::TensorShard{DType::kFloat32, {0, 7}, {0, 0}, {0, 7}, {}}));
      roots[r] = engine::StateNode(engine::StateDict{});
      roots[r].set("model", engine::StateNode(std::move(model)));
    }
    auto st = storage::open_local_storage_at(local);
    comm::ThreadGroup group(world);
    group.run([&](comm::Communicator& comm) { engine::save(roots[comm.rank()], *st, comm); });
  }
  const std::string mem = "memory://tiny-" + std::to_string(::getpid());
  copy_objects(*storage::open_local_storage_at(local), *storage::open_storage(mem));
  engine::ConsolidateOptions o;
  o.layout = engine::ConsolidateLayout::kDcp;
  o.checkpoint_folder = Location::parse(local);
  fs::create_directories(dir.file("whole"));
  fs::create_directories(dir.file("tiny"));
  o.output_file = Location::parse(dir.file("whole/out.pt"));  // same names: the archive name comes from it
  engine::consolidate(o);
  const std::string want = testing::read_text(dir.file("whole/out.pt"));
  o.memory_budget_bytes = 1 << 20;
  o.output_file = Location::parse(dir.file("tiny/out.pt"));
  engine::ConsolidateReport report = engine::consolidate(o);
  EXPECT_LE(report.slab_bytes, std::size_t{1} << 20);
  EXPECT_TRUE(testing::read_text(dir.file("tiny/out.pt")) == want);
  o.checkpoint_folder = Location::parse(mem);
  o.output_file = Location::parse(mem + "-out/out.pt");
  engine::consolidate(o);
  EXPECT_TRUE(read_object(mem + "-out/out.pt") == want);
}

TEST(RemoteConsolidateTest, AzureBothWaysEqualsLocalToLocal) {
  SP_REQUIRE_AZURITE(endpoint);
  auto config = storage::testing::azurite_config(endpoint);
  const std::string container = storage::testing::fresh_container(config);
  ::setenv("AZURE_STORAGE_CONNECTION_STRING", storage::testing::azurite_connection_string(endpoint).c_str(), 1);
  ::setenv("SHARDPOINT_AZURE_BACKOFF_MS", "10", 1);
  TempDir dir;
  std::string want;
  consolidate_both_ways(dir, container, "az", want);
  ::unsetenv("AZURE_STORAGE_CONNECTION_STRING");
  ::unsetenv("SHARDPOINT_AZURE_BACKOFF_MS");
}

}  // namespace
}  // namespace shardpoint
