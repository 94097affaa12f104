// The commit protocol as object stores see it (issue 6): engine save() and reshard() publish
// every data object first, then the checksum sidecar, then `.metadata` as one atomic write
// (one PUT on S3 / Azure), last; and every reader (load, CheckpointReader as used by inspect
// / verify / consolidate, locate_checkpoint, reshard) refuses a prefix without `.metadata`
// as "not a committed checkpoint", naming it. A recording StorageWrapper over the memory
// driver logs the publishing calls in order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "comm/thread_communicator.h"
#include "engine/checkpoint_location.h"
#include "engine/checkpoint_test_state.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/checkpoint_reader.h"
#include "shardpoint/error.h"
#include "shardpoint/reshard.h"
#include "shardpoint/storage_registry.h"
#include "storage/storage_wrapper.h"

namespace shardpoint::engine {
namespace {

using testing::make_rank_state;
using testing::RankState;

// Publishing calls in the order they happened: "commit KEY" when a streaming writer
// commits, "atomic KEY" for write_atomic (then "not durable: KEY" when it asked for no
// fsync), "open KEY" when a writer is opened.
class RecordingStorage final : public storage::StorageWrapper {
 public:
  using StorageWrapper::StorageWrapper;

  std::unique_ptr<storage::StorageWriter> open_writer(std::string_view key, const storage::WriteOptions& options,
                                                      const storage::IoOptions& io) override {
    record("open " + std::string(key));
    return std::make_unique<Writer>(*this, target().open_writer(key, options, io));
  }
  void write_atomic(std::string_view key, ByteSpan data, const storage::WriteOptions& options,
                    const storage::IoOptions& io) override {
    target().write_atomic(key, data, options, io);
    record("atomic " + std::string(key));
    if (!options.durable) record("not durable: " + std::string(key));
  }

  std::vector<std::string> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }

 private:
  class Writer final : public storage::StorageWriter {
   public:
    Writer(RecordingStorage& owner, std::unique_ptr<storage::StorageWriter> target)
        : owner_(owner), target_(std::move(target)) {}
    void append(ByteSpan data, const storage::IoOptions& io) override { target_->append(data, io); }
    void write_at(std::uint64_t offset, ByteSpan data, const storage::IoOptions& io) override {
      target_->write_at(offset, data, io);
    }
    void commit(const storage::IoOptions& io) override {
      target_->commit(io);
      owner_.record("commit " + target_->key());
    }
    const std::string& key() const override { return target_->key(); }
    std::uint64_t position() const override { return target_->position(); }

   private:
    RecordingStorage& owner_;
    std::unique_ptr<storage::StorageWriter> target_;
  };

  void record(std::string event) {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(event));
  }

  mutable std::mutex mu_;
  std::vector<std::string> events_;
};

std::string unique_url(const std::string& what) {
  static std::atomic<int> n{0};
  return "memory://commit-order-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

void save_on(int world, storage::Storage& st) {
  std::vector<RankState> states;
  for (int r = 0; r < world; ++r) states.push_back(make_rank_state(r, world, true));
  comm::ThreadGroup group(world, comm::CommOptions{std::chrono::seconds(30)});
  group.run([&](comm::Communicator& comm) { save(states[comm.rank()].root, st, comm); });
}

// The order save() and reshard() must keep: data objects (streamed), then the sidecar,
// then `.metadata` once, as the last publishing call, never through a streaming writer.
void expect_commit_order(const std::vector<std::string>& events, int data_files) {
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "atomic .metadata");
  EXPECT_EQ(std::count_if(events.begin(), events.end(), [](const std::string& e) { return e.ends_with(" .metadata"); }),
            1)
      << "one write of .metadata";
  const auto sidecar = std::find(events.begin(), events.end(), std::string("atomic ") + kChecksumSidecar);
  ASSERT_NE(sidecar, events.end());
  // The index is not synced on its own: a crash that damages it makes loads ignore it.
  EXPECT_EQ(std::vector<std::string>(sidecar + 1, events.end()),
            (std::vector<std::string>{std::string("atomic ") + kIndexKey, std::string("not durable: ") + kIndexKey,
                                      "atomic .metadata"}))
      << "the sidecar, then the load index, then .metadata";
  int committed = 0;
  for (auto it = events.begin(); it != sidecar; ++it) {
    EXPECT_TRUE(it->starts_with("open __") || it->starts_with("commit __")) << *it;
    if (it->starts_with("commit __") && it->ends_with(".distcp")) ++committed;
  }
  EXPECT_EQ(committed, data_files);
}

// Runs fn on 2 ranks (threads); what each rank threw, empty for a rank that did not.
std::vector<std::string> errors_on_two_ranks(const std::function<void(comm::Communicator&)>& fn) {
  comm::ThreadGroup group(2, comm::CommOptions{std::chrono::seconds(30)});
  std::vector<std::string> errors(2);
  group.run([&](comm::Communicator& comm) {
    try {
      fn(comm);
    } catch (const std::exception& e) {
      errors[comm.rank()] = e.what();
    }
  });
  return errors;
}

TEST(CommitOrderTest, SaveWritesDataThenSidecarThenMetadataLastInOneWrite) {
  auto memory = std::shared_ptr<storage::Storage>(storage::open_storage(unique_url("save")));
  RecordingStorage st(memory);
  save_on(3, st);
  expect_commit_order(st.events(), 3);
}

TEST(CommitOrderTest, ReshardWritesDataThenSidecarThenMetadataLastInOneWrite) {
  const std::string source = unique_url("reshard-src");
  save_on(2, *storage::open_storage(source));
  auto memory = std::shared_ptr<storage::Storage>(storage::open_storage(unique_url("reshard-dst")));
  RecordingStorage st(memory);
  ReshardOptions options;
  options.ranks = 4;
  options.save.thread_count = 2;
  reshard(source, st, options);
  expect_commit_order(st.events(), 8);
}

// Expects fn to throw a StorageError saying "not a committed checkpoint" and naming `name`.
template <typename Fn>
void expect_not_a_checkpoint(Fn fn, const std::string& name, const std::string& who) {
  try {
    fn();
    ADD_FAILURE() << who << ": no error";
  } catch (const StorageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("not a committed checkpoint"), std::string::npos) << who << ": " << what;
    EXPECT_NE(what.find(name), std::string::npos) << who << ": " << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << who << ": " << e.what();
  }
}

TEST(CommitOrderTest, EveryReaderRefusesAPrefixWithoutMetadata) {
  const std::string url = unique_url("uncommitted");
  auto st = storage::open_storage(url);
  save_on(2, *st);
  st->remove(".metadata");  // data and sidecar present: what a crash before the commit leaves
  ASSERT_FALSE(st->list("__0_").empty());

  expect_not_a_checkpoint([&] { read_metadata(*st); }, url, "read_metadata");
  expect_not_a_checkpoint([&] { CheckpointReader reader(*st); }, url, "CheckpointReader");
  expect_not_a_checkpoint([&] { locate_checkpoint(Location::parse(url)); }, url, "locate_checkpoint");
  expect_not_a_checkpoint(
      [&] {
        auto out = storage::open_storage(unique_url("out"));
        reshard(url, *out, ReshardOptions{});
      },
      url, "reshard");
  // load() on 2 ranks: every rank gets the coordinator's error.
  std::vector<RankState> states;
  for (int r = 0; r < 2; ++r) states.push_back(make_rank_state(r, 2, false));
  const std::vector<std::string> errors =
      errors_on_two_ranks([&](comm::Communicator& comm) { load(states[comm.rank()].root, *st, comm); });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("not a committed checkpoint"), std::string::npos) << e;
    EXPECT_NE(e.find(url), std::string::npos) << e;
  }
}

TEST(CommitOrderTest, AFailedReshardLeavesNoMetadataAndRemovesItsFiles) {
  const std::string source = unique_url("fail-src");
  save_on(2, *storage::open_storage(source));
  auto memory = std::shared_ptr<storage::Storage>(storage::open_storage(unique_url("fail-dst")));
  // Corrupt one source blob's data so reading it fails its checksum mid-reshard.
  auto src = storage::open_storage(source);
  const std::uint64_t size = src->stat("__1_0.distcp");
  std::string bytes(size, '\0');
  src->read("__1_0.distcp", 0, std::as_writable_bytes(std::span(bytes)));
  bytes[size / 2] ^= 0x01;
  src->write_atomic("__1_0.distcp", as_bytes(bytes));
  ReshardOptions options;
  options.ranks = 3;
  EXPECT_ANY_THROW(reshard(source, *memory, options));
  EXPECT_FALSE(memory->try_stat(".metadata"));
  EXPECT_TRUE(memory->list("").empty());
}

// A storage whose write_atomic of `.metadata` fails, as a lost connection at the commit.
class FailingCommitStorage final : public storage::StorageWrapper {
 public:
  using StorageWrapper::StorageWrapper;
  void write_atomic(std::string_view key, ByteSpan data, const storage::WriteOptions& options,
                    const storage::IoOptions& io) override {
    if (key == ".metadata") throw StorageError(StorageError::Kind::kTransient, "injected: .metadata write failed");
    target().write_atomic(key, data, options, io);
  }
};

// The keys under st, space-separated.
std::string keys_under(storage::Storage& st) {
  std::string keys;
  for (const storage::ObjectInfo& o : st.list("")) keys += (keys.empty() ? "" : " ") + o.key;
  return keys;
}

// save() and reshard() share the commit step (save_steps::commit_checkpoint): when writing
// `.metadata` fails after the sidecar was written, the sidecar is removed again, and so are
// the data files, leaving the destination empty.
TEST(CommitOrderTest, AFailedMetadataWriteLeavesNoSidecarAndNoFiles) {
  {
    auto memory = std::shared_ptr<storage::Storage>(storage::open_storage(unique_url("commit-fail-save")));
    FailingCommitStorage st(memory);
    std::vector<RankState> states;
    for (int r = 0; r < 2; ++r) states.push_back(make_rank_state(r, 2, true));
    const std::vector<std::string> errors =
        errors_on_two_ranks([&](comm::Communicator& comm) { save(states[comm.rank()].root, st, comm); });
    for (const std::string& e : errors) EXPECT_NE(e.find("injected: .metadata write failed"), std::string::npos) << e;
    EXPECT_EQ(keys_under(*memory), "") << "save";
  }
  {
    const std::string source = unique_url("commit-fail-src");
    save_on(2, *storage::open_storage(source));
    auto memory = std::shared_ptr<storage::Storage>(storage::open_storage(unique_url("commit-fail-dst")));
    FailingCommitStorage st(memory);
    ReshardOptions options;
    options.ranks = 3;
    EXPECT_THROW(reshard(source, st, options), StorageError);
    EXPECT_EQ(keys_under(*memory), "") << "reshard";
  }
}

}  // namespace
}  // namespace shardpoint::engine
