// Checkpoints on s3:// end to end against moto and s3s-fs, both checking SigV4 signatures
// (s3_servers.h): engine::save on 4
// in-process ranks, load on 2, `shardpoint inspect --json --hash` equal to a local copy; a
// failed save leaves no `.metadata` and no multipart upload; the server killed in the middle of an
// upload fails the save, and after a restart the retried save succeeds; the replicated small
// tensors each rank's first file holds are read back in one ranged GET per saving rank.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "comm/thread_communicator.h"
#include "engine/checkpoint_test_state.h"
#include "fault_proxy.h"
#include "layered_state.h"
#include "s3_servers.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/fault_injection_storage.h"
#include "storage/http/http_client.h"
#include "storage/local_storage.h"
#include "storage/s3/s3_storage.h"
#include "storage_test_util.h"
#include "test_util.h"

namespace shardpoint::storage::testing {
namespace {

using engine::testing::compare_with_expected;
using engine::testing::make_rank_state;
using engine::testing::RankState;

comm::CommOptions fast() { return comm::CommOptions{std::chrono::seconds(60)}; }

std::string unique_url(const std::string& name) { return "s3://sp-test/" + shardpoint::testing::unique_name(name); }

void save_on(int world, Storage& st, engine::SaveOptions options = {}) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, true));
  comm::ThreadGroup group(world, fast());
  group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, st, comm, options); });
}

void load_and_check(int world, Storage& st) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, false));
  comm::ThreadGroup group(world, fast());
  group.run([&](comm::Communicator& comm) { engine::load(states[comm.rank()].root, st, comm); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(compare_with_expected(states[r], r, world), "") << "rank " << r;
}

// A big float32 tensor [rows, 1024] sharded by rows over `world` ranks (rows % world == 0).
struct BigState {
  std::vector<std::byte> bytes;
  engine::StateNode root;
};

BigState big_state(int rank, int world, std::int64_t rows) {
  BigState s;
  const std::int64_t mine = rows / world;
  s.bytes.resize(static_cast<std::size_t>(mine) * 1024 * 4);
  std::uint32_t x = static_cast<std::uint32_t>(rank) * 2654435761u + 1;
  for (auto& b : s.bytes) {
    x = x * 1103515245u + 12345u;
    b = static_cast<std::byte>(x >> 24);
  }
  engine::TensorShard t;
  t.dtype = DType::kFloat32;
  t.global_shape = {rows, 1024};
  t.offsets = {mine * rank, 0};
  t.sizes = {mine, 1024};
  t.data = std::span<std::byte>(s.bytes.data(), s.bytes.size());
  engine::StateDict d;
  d.emplace_back("w", engine::StateNode(std::move(t)));
  s.root = engine::StateNode(std::move(d));
  return s;
}

// Every test on each S3 server (s3_servers.h): moto and s3s-fs.
class S3CheckpointTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(S3, S3CheckpointTest, s3_server_kinds(), S3ServerKindName());

TEST_P(S3CheckpointTest, SaveOn4LoadOn2AndInspectEqualsALocalCopy) {
  SP_REQUIRE_S3(server, GetParam());
  const std::string url = unique_url("ckpt");
  auto st = open_storage(url);  // through the registry, as every command does
  save_on(4, *st);
  EXPECT_TRUE(st->try_stat(".metadata"));
  load_and_check(2, *st);
  load_and_check(4, *st);

  // A local copy, object by object.
  shardpoint::testing::TempDir dir;
  auto local = open_local_storage_at(dir.file("copy"));
  copy_objects(*st, *local);
  const std::string cli = SP_SHARDPOINT;
  auto remote = shardpoint::testing::run_command("'" + cli + "' inspect --json --hash '" + url + "' 2>&1");
  auto copy = shardpoint::testing::run_command("'" + cli + "' inspect --json --hash '" + dir.file("copy") + "' 2>&1");
  EXPECT_EQ(remote.exit_code, 0) << remote.output;
  EXPECT_EQ(copy.exit_code, 0) << copy.output;
  EXPECT_NE(remote.output.find("\"sha256\""), std::string::npos) << remote.output;
  EXPECT_EQ(remote.output, copy.output);
}

TEST_P(S3CheckpointTest, ALargeCheckpointUsesMultipartAndLoadsResharded) {
  SP_REQUIRE_S3(server, GetParam());
  auto st = open_storage(unique_url("big"));
  constexpr std::int64_t kRows = 4 * 2048;  // 8 MiB per rank of 4: parts of 8 MiB, ranged GETs
  {
    std::vector<BigState> states;
    for (int r = 0; r < 4; ++r) states.push_back(big_state(r, 4, kRows));
    comm::ThreadGroup group(4, fast());
    group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });
  }
  std::vector<BigState> want;
  for (int r = 0; r < 4; ++r) want.push_back(big_state(r, 4, kRows));
  std::vector<BigState> got;
  for (int r = 0; r < 2; ++r) {
    got.push_back(big_state(r, 2, kRows));
    std::fill(got.back().bytes.begin(), got.back().bytes.end(), std::byte{0});
  }
  comm::ThreadGroup group(2, fast());
  group.run([&](comm::Communicator& comm) { engine::load(got[comm.rank()].root, *st, comm); });
  for (int r = 0; r < 2; ++r) {
    std::vector<std::byte> expected = want[2 * r].bytes;
    expected.insert(expected.end(), want[2 * r + 1].bytes.begin(), want[2 * r + 1].bytes.end());
    EXPECT_TRUE(got[r].bytes == expected) << "rank " << r;
  }
}

TEST_P(S3CheckpointTest, FailedSaveLeavesNoMetadataAndNoUpload) {
  SP_REQUIRE_S3(server, GetParam());
  std::shared_ptr<Storage> s3 = open_storage(unique_url("failed"));
  auto faulty = std::make_shared<FaultInjectionStorage>(s3);
  faulty->fail(FaultRule{FaultOp::kCommit, 1, StorageError::Kind::kTransient, "__2_"});  // rank 2's file
  constexpr std::int64_t kRows = 4 * 2048;
  std::vector<BigState> states;
  for (int r = 0; r < 4; ++r) states.push_back(big_state(r, 4, kRows));
  comm::ThreadGroup group(4, fast());
  EXPECT_ANY_THROW(group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *faulty, comm); }));
  EXPECT_FALSE(s3->try_stat(".metadata"));
  EXPECT_EQ(open_uploads(*server, "sp-test"), 0);
}

TEST_P(S3CheckpointTest, ServerKilledMidUploadFailsThenRetriedSaveSucceeds) {
  std::string why;
  auto moto = start_s3_server(GetParam(), {"sp-kill"}, &why);
  if (!moto) {
    if (shardpoint::testing::oracles_required()) FAIL() << why;
    GTEST_SKIP() << why;
  }
  auto open = [&] {
    s3::S3Config c;
    c.bucket = "sp-kill";
    c.prefix = "ckpt";
    c.endpoint = moto->endpoint();
    c.path_style = true;
    c.credentials.access_key_id = moto->access_key();
    c.credentials.secret_access_key = moto->secret_key();
    c.credentials.source = "test";
    c.retry.max_attempts = 3;
    c.retry.initial_backoff = std::chrono::milliseconds(10);
    c.retry.connect_timeout = std::chrono::milliseconds(2000);
    c.retry.low_speed_time = std::chrono::seconds(5);
    return std::shared_ptr<Storage>(s3::make_s3_storage(c));
  };
  constexpr std::int64_t kRows = 4 * 8192;  // 32 MiB per rank
  std::vector<BigState> states;
  for (int r = 0; r < 4; ++r) states.push_back(big_state(r, 4, kRows));
  auto st = open();
  std::exception_ptr error;
  {
    std::jthread killer([&] {
      // Kill once an upload is under way.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (open_uploads(*moto, "sp-kill") < 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      moto->kill();
    });
    comm::ThreadGroup group(4, fast());
    try {
      group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });
    } catch (...) {
      error = std::current_exception();
    }
  }
  ASSERT_TRUE(error) << "save succeeded although the server was killed";
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s3://sp-kill/ckpt/"), std::string::npos) << e.what();
  }
  // The restarted server starts empty (moto: a new user, key and bucket; s3s-fs: a new root).
  ASSERT_TRUE(moto->restart(&why)) << why;
  st = open();
  EXPECT_FALSE(st->try_stat(".metadata"));
  EXPECT_EQ(open_uploads(*moto, "sp-kill"), 0);
  {
    comm::ThreadGroup group(4, fast());
    group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });
  }
  EXPECT_TRUE(st->try_stat(".metadata"));
  EXPECT_EQ(open_uploads(*moto, "sp-kill"), 0);
  std::vector<BigState> got;
  got.push_back(big_state(0, 1, kRows));
  std::fill(got[0].bytes.begin(), got[0].bytes.end(), std::byte{0});
  comm::ThreadGroup group(1, fast());
  group.run([&](comm::Communicator& comm) { engine::load(got[0].root, *st, comm); });
  std::vector<std::byte> expected;
  for (const auto& s : states) expected.insert(expected.end(), s.bytes.begin(), s.bytes.end());
  EXPECT_TRUE(got[0].bytes == expected);
}

TEST_P(S3CheckpointTest, ReplicatedSmallTensorsAreReadWithOneGetPerSavingRank) {
  SP_REQUIRE_S3(server, GetParam());
  std::string why;
  auto proxy = FaultProxy::start(server->endpoint(), /*slow_seconds=*/3.5, &why);
  ASSERT_NE(proxy, nullptr) << why;
  // Through the proxy, which counts the requests; 256 KiB read windows, so the 128 KiB
  // weights between the steps of the old layout (gaps above window / 8) kept each step a GET
  // of its own.
  s3::S3Config config = s3::s3_config(Location::parse(unique_url("small")));
  config.endpoint = proxy->endpoint();
  config.path_style = true;
  config.source_window_bytes = 256 << 10;
  auto st = s3::make_s3_storage(config);
  constexpr int kWorld = 4;
  constexpr std::size_t kLayers = 24;
  {
    std::vector<LayeredState> states;
    states.reserve(kWorld);
    for (int r = 0; r < kWorld; ++r) states.push_back(layered_state(r, kWorld, kLayers, true, true));
    comm::ThreadGroup group(kWorld, fast());
    group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });
  }
  auto ranged_gets = [&] {
    const nlohmann::json stats = proxy->stats();
    return stats["requests"].value("RGET", 0);
  };
  int data_files = 0;  // 4 per rank on an object store (engine/save_plan.h files_per_rank)
  for (const ObjectInfo& o : st->list("")) data_files += o.key.ends_with(".distcp") ? 1 : 0;
  ASSERT_EQ(data_files, kWorld * 4);

  // Ranks loading only the steps: one GET of one file per saving rank and loading rank (a
  // rank's small items all lie in its first file), not one per step or per file (plus the
  // coordinator's two of `.metadata` and the load index). The old layout took 24 per file.
  for (int world : {1, kWorld}) {
    proxy->set_faults("");
    std::vector<LayeredState> steps;
    steps.reserve(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) steps.push_back(layered_state(r, world, kLayers, false, false));
    comm::ThreadGroup group(world, fast());
    group.run([&](comm::Communicator& comm) { engine::load(steps[comm.rank()].root, *st, comm); });
    for (int r = 0; r < world; ++r) {
      for (std::size_t i = 0; i < kLayers; ++i) {
        EXPECT_EQ(steps[r].buffers[2 * i][0], static_cast<float>(i + 1)) << "rank " << r << " layer " << i;
      }
    }
    EXPECT_LE(ranged_gets(), world * kWorld + 2) << "loading on " << world;
  }

  // Everything, on four ranks.
  std::vector<LayeredState> got;
  got.reserve(kWorld);
  for (int r = 0; r < kWorld; ++r) got.push_back(layered_state(r, kWorld, kLayers, true, false));
  comm::ThreadGroup group(kWorld, fast());
  group.run([&](comm::Communicator& comm) { engine::load(got[comm.rank()].root, *st, comm); });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(got[r].buffers == layered_state(r, kWorld, kLayers, true, true).buffers) << "rank " << r;
  }
}

}  // namespace
}  // namespace shardpoint::storage::testing
