// engine::save / load and `shardpoint inspect` over az:// URLs on Azurite: 4 ranks save,
// 2 ranks load; inspect hashes equal a local copy's; a server killed mid-save leaves no
// committed checkpoint and the retried save after a restart succeeds.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "azure_test_util.h"
#include "comm/thread_communicator.h"
#include "engine/checkpoint_test_state.h"
#include "fault_proxy.h"
#include "layered_state.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/error.h"
#include "shardpoint/storage_registry.h"
#include "storage/azure/azure_storage.h"
#include "storage/local_storage.h"
#include "test_util.h"

namespace shardpoint::storage::testing {
namespace {

using engine::testing::compare_with_expected;
using engine::testing::make_rank_state;
using engine::testing::RankState;

comm::CommOptions fast() { return comm::CommOptions{std::chrono::seconds(60)}; }

void save_on(int world, Storage& st) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, true));
  comm::ThreadGroup group(world, fast());
  group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, st, comm); });
}

void load_and_check(int world, Storage& st) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, false));
  comm::ThreadGroup group(world, fast());
  group.run([&](comm::Communicator& comm) { engine::load(states[comm.rank()].root, st, comm); });
  for (int r = 0; r < world; ++r) EXPECT_EQ(compare_with_expected(states[r], r, world), "") << "rank " << r;
}

// Runs a command with the Azurite connection string in its environment; returns stdout.
std::string run_capture(const std::string& command, int* exit_code) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(AzureEngineTest, SaveOnFourLoadOnTwoAndInspectMatchesALocalCopy) {
  SP_REQUIRE_AZURITE(endpoint);
  azure::AzureConfig config = azurite_config(endpoint);
  std::string container = fresh_container(config);
  const std::string url = container + "/runs/step=100";
  // Through the registry, as every command does: the driver reads the environment.
  ::setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(endpoint).c_str(), 1);
  ::setenv("SHARDPOINT_AZURE_BACKOFF_MS", "10", 1);
  auto st = open_storage(url);
  save_on(4, *st);
  const std::vector<ObjectInfo> objects = st->list("");
  std::vector<std::string> keys;
  for (const auto& o : objects) keys.push_back(o.key);
  EXPECT_NE(std::find(keys.begin(), keys.end(), ".metadata"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "__3_0.distcp"), keys.end());
  load_and_check(2, *st);
  load_and_check(4, *open_storage(url));

  // A byte-identical local copy.
  shardpoint::testing::TempDir dir;
  auto local = open_local_storage_at(dir.path().string());
  for (const auto& o : objects) {
    std::string bytes(o.size, '\0');
    st->read(o.key, 0, std::as_writable_bytes(std::span(bytes)));
    local->write_atomic(o.key, as_bytes(bytes));
  }
  int rc_az = -1, rc_local = -1;
  std::string az = run_capture(std::string(SP_SHARDPOINT) + " inspect --json --hash '" + url + "'", &rc_az);
  std::string lo =
      run_capture(std::string(SP_SHARDPOINT) + " inspect --json --hash '" + dir.path().string() + "'", &rc_local);
  ASSERT_EQ(rc_az, 0) << az;
  ASSERT_EQ(rc_local, 0) << lo;
  nlohmann::json ja = nlohmann::json::parse(az), jl = nlohmann::json::parse(lo);
  ASSERT_TRUE(ja.contains("tensors")) << az;
  EXPECT_EQ(ja["tensors"], jl["tensors"]);
  EXPECT_TRUE(ja["tensors"]["model.w"].contains("sha256")) << az;

  // A wrong key through the CLI: a failure exit, one line naming the URL, no secret.
  std::string bad_cs = azurite_connection_string(endpoint);
  std::string wrong = azure::base64_encode(std::string(64, 'w'));
  bad_cs.replace(bad_cs.find(kAzuriteKey), std::string(kAzuriteKey).size(), wrong);
  int rc_bad = -1;
  std::string err = run_capture(
      "AZURE_STORAGE_CONNECTION_STRING='" + bad_cs + "' " + SP_SHARDPOINT + " inspect --json '" + url + "' 2>&1",
      &rc_bad);
  EXPECT_NE(rc_bad, 0) << err;
  EXPECT_NE(err.find("403"), std::string::npos) << err;
  EXPECT_NE(err.find(url), std::string::npos) << err;
  EXPECT_EQ(err.find(wrong), std::string::npos) << err;
  ::unsetenv("AZURE_STORAGE_CONNECTION_STRING");
  ::unsetenv("SHARDPOINT_AZURE_BACKOFF_MS");
}

// Ranks loading only the steps (small items that DCP spreads over the ranks' files) read
// windows of the objects that hold them, not the objects whole: 4 ranks x 48 layers of
// 128 KiB weights make 16 data objects of about 1.5 MiB. Read whole, every rank would
// download every object holding a step (the 32 MiB threshold did: 4x a load's bytes).
// fault_proxy.py in front of Azurite counts the bytes it sent.
TEST(AzureEngineTest, SmallItemsOfLargeObjectsAreReadInWindowsNotWhole) {
  SP_REQUIRE_AZURITE(endpoint);
  std::string why;
  auto proxy = FaultProxy::start(endpoint, /*slow_seconds=*/3.5, &why);
  ASSERT_NE(proxy, nullptr) << why;
  const std::string url = fresh_container(azurite_config(endpoint)) + "/windows";
  auto st = azure::open_azure_storage_with(Location::parse(url), azurite_config(proxy->endpoint()));
  constexpr int kWorld = 4;
  constexpr std::size_t kLayers = 48;
  {
    std::vector<LayeredState> states;
    states.reserve(kWorld);
    for (int r = 0; r < kWorld; ++r) states.push_back(layered_state(r, kWorld, kLayers, true, true));
    comm::ThreadGroup group(kWorld, fast());
    group.run([&](comm::Communicator& comm) { engine::save(states[comm.rank()].root, *st, comm); });
  }
  std::uint64_t data_bytes = 0;
  for (const ObjectInfo& o : st->list("")) {
    if (!o.key.ends_with(".distcp")) continue;
    data_bytes += o.size;
    ASSERT_GT(o.size, std::uint64_t{1} << 20) << o.key;  // above the whole-object threshold
  }

  proxy->set_faults("");  // resets the counts
  std::vector<LayeredState> steps;
  steps.reserve(kWorld);
  for (int r = 0; r < kWorld; ++r) steps.push_back(layered_state(r, kWorld, kLayers, false, false));
  comm::ThreadGroup group(kWorld, fast());
  group.run([&](comm::Communicator& comm) { engine::load(steps[comm.rank()].root, *st, comm); });
  for (int r = 0; r < kWorld; ++r) {
    for (std::size_t i = 0; i < kLayers; ++i) {
      EXPECT_EQ(steps[r].buffers[2 * i][0], static_cast<float>(i + 1)) << "rank " << r << " layer " << i;
    }
  }
  const nlohmann::json stats = proxy->stats();
  const std::uint64_t got = stats["bytes"].value("GET", std::uint64_t{0});
  EXPECT_LT(got, data_bytes / 4) << stats["requests"].dump() << " for " << data_bytes << " bytes of data objects";
}

// Kills the server after `after` writers were opened (once), from inside the save.
class KillingStorage final : public Storage {
 public:
  KillingStorage(std::shared_ptr<Storage> target, AzuriteProcess* server, int after)
      : target_(std::move(target)), server_(server), after_(after) {}
  StorageFeatures features() const override { return target_->features(); }
  std::string url() const override { return target_->url(); }
  std::string describe_key(std::string_view key) const override { return target_->describe_key(key); }
  std::uint64_t stat(std::string_view key, const IoOptions& io) override { return target_->stat(key, io); }
  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out, const IoOptions& io) override {
    target_->read(key, offset, out, io);
  }
  std::unique_ptr<ByteSource> open_source(std::string_view key, const SourceOptions& o, const IoOptions& io) override {
    return target_->open_source(key, o, io);
  }
  std::unique_ptr<StorageWriter> open_writer(std::string_view key, const WriteOptions& o,
                                             const IoOptions& io) override {
    {
      std::lock_guard lock(mu_);
      if (++opened_ == after_) server_->stop();
    }
    return target_->open_writer(key, o, io);
  }
  void write_atomic(std::string_view key, ByteSpan data, const WriteOptions& o, const IoOptions& io) override {
    target_->write_atomic(key, data, o, io);
  }
  std::vector<ObjectInfo> list(std::string_view prefix, const IoOptions& io) override {
    return target_->list(prefix, io);
  }
  void remove(std::string_view key, const IoOptions& io) override { target_->remove(key, io); }
  std::size_t remove_prefix(std::string_view prefix, const IoOptions& io) override {
    return target_->remove_prefix(prefix, io);
  }

 private:
  std::shared_ptr<Storage> target_;
  AzuriteProcess* server_;
  int after_;
  std::mutex mu_;
  int opened_ = 0;
};

TEST(AzureEngineTest, ServerKilledMidSaveCommitsNothingAndTheRetriedSaveSucceeds) {
  SP_REQUIRE_AZURITE(shared);  // only to skip without Azurite; this test runs its own server
  std::string dir =
      (std::filesystem::temp_directory_path() / ("sp-azurite-save-" + std::to_string(::getpid()))).string();
  AzuriteProcess server(dir);
  ASSERT_TRUE(server.start()) << server.error();
  azure::AzureConfig config = azurite_config(server.endpoint());
  const std::string url = fresh_container(config) + "/ckpt";
  std::shared_ptr<Storage> st = azure::open_azure_storage_with(Location::parse(url), config);
  auto killing = std::make_shared<KillingStorage>(st, &server, 3);
  try {
    save_on(4, *killing);
    FAIL() << "save to a killed server succeeded";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find(url), std::string::npos) << e.what();
  } catch (const CommError& e) {
    ADD_FAILURE() << "expected the storage error, got " << e.what();
  }
  ASSERT_TRUE(server.start()) << server.error();
  azure::create_azure_container(Location::parse(url.substr(0, url.find('/', 5))), config);
  EXPECT_FALSE(st->try_stat(".metadata"));  // not committed
  save_on(4, *st);                          // the retried save
  ASSERT_TRUE(st->try_stat(".metadata"));
  load_and_check(2, *st);
  server.stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace shardpoint::storage::testing
