// async_save_worker: one rank of the multi-process async_save tests (async_save_test.cc).
// The communicator comes from make_communicator_from_env() (Gloo under launch_ranks; TCP
// in builds without Gloo).
//
//   async_save_worker save-twice DIR1 DIR2   async-saves the state of checkpoint_test_state.h
//       into DIR1, scribbles over it and runs collectives while the files are written, then
//       async-saves it again into DIR2 over the same staging pool (which commits DIR1 first)
//   async_save_worker save-fail-rank-2 DIR   rank 2's writes fail: every rank's wait() must
//       throw "save failed on rank 2 (of N)"
//   async_save_worker load DIR               loads DIR and checks every value
//
// Exit codes: 0 ok, 1 unexpected result, 2 an exception. Output lines start with "rank R: ".
#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>

#include "engine/checkpoint_test_state.h"
#include "shardpoint/async_save.h"
#include "shardpoint/checkpoint.h"
#include "shardpoint/communicator_from_env.h"
#include "shardpoint/error.h"
#include "storage/fault_injection_storage.h"
#include "storage/local_storage.h"

namespace se = shardpoint::engine;

namespace {

int rank = -1;

void say(const std::string& line) {
  std::ostringstream s;
  s << "rank " << rank << ": " << line << "\n";
  std::cout << s.str() << std::flush;
}

void scribble(se::testing::RankState& state) {
  for (auto& buffer : state.buffers) std::fill(buffer->begin(), buffer->end(), std::byte{0x5A});
}

int save_twice(shardpoint::comm::Communicator& comm, const std::string& dir1, const std::string& dir2) {
  auto first = shardpoint::storage::open_local_storage_at(dir1);
  auto second = shardpoint::storage::open_local_storage_at(dir2);
  se::StagingPool staging;
  se::AsyncSaveOptions options;
  options.staging = &staging;
  options.save.durable = false;
  se::testing::RankState state = se::testing::make_rank_state(comm.rank(), comm.world_size(), true);
  auto a = se::async_save(state.root, *first, comm, options);
  scribble(state);
  // The trainer's collectives while the background thread writes.
  comm.barrier();
  const std::vector<std::string> all = comm.all_gather("step");
  if (all.size() != static_cast<std::size_t>(comm.world_size())) return 1;
  state = se::testing::make_rank_state(comm.rank(), comm.world_size(), true);
  auto b = se::async_save(state.root, *second, comm, options);  // commits `a` first
  if (!first->try_stat(".metadata")) {
    say("the first checkpoint is not committed when the second save starts");
    return 1;
  }
  scribble(state);
  const se::SaveReport report = b->wait();
  a->wait();
  say("saved twice; stall " + std::to_string(b->report().stall_seconds) + " s, " +
      std::to_string(report.bytes_written) + " bytes");
  return 0;
}

int save_fail(shardpoint::comm::Communicator& comm, const std::string& dir) {
  std::shared_ptr<shardpoint::storage::Storage> target = shardpoint::storage::open_local_storage_at(dir);
  shardpoint::storage::FaultInjectionStorage faulty(target);
  if (comm.rank() == 2) {
    faulty.fail_nth(shardpoint::storage::FaultOp::kWrite, 1, shardpoint::StorageError::Kind::kNoSpace);
  }
  se::testing::RankState state = se::testing::make_rank_state(comm.rank(), comm.world_size(), true);
  auto pending = se::async_save(state.root, faulty, comm);
  try {
    pending->wait();
  } catch (const shardpoint::StorageError& e) {
    const std::string want = "save failed on rank 2 (of " + std::to_string(comm.world_size()) + ")";
    if (std::string(e.what()).find(want) == std::string::npos) {
      say(std::string("unexpected message: ") + e.what());
      return 1;
    }
    say("failed as expected");
    return 0;
  }
  say("wait() did not throw");
  return 1;
}

int load(shardpoint::comm::Communicator& comm, const std::string& dir) {
  auto st = shardpoint::storage::open_local_storage_at(dir);
  se::testing::RankState state = se::testing::make_rank_state(comm.rank(), comm.world_size(), false);
  se::load(state.root, *st, comm);
  const std::string diff = se::testing::compare_with_expected(state, comm.rank(), comm.world_size());
  if (!diff.empty()) {
    say("MISMATCH: " + diff);
    return 1;
  }
  say("loaded ok");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    auto comm = shardpoint::comm::make_communicator_from_env(shardpoint::comm::CommOptions{std::chrono::seconds(60)});
    rank = comm->rank();
    if (mode == "save-twice" && argc == 4) return save_twice(*comm, argv[2], argv[3]);
    if (mode == "save-fail-rank-2" && argc == 3) return save_fail(*comm, argv[2]);
    if (mode == "load" && argc == 3) return load(*comm, argv[2]);
    std::cerr << "usage: async_save_worker save-twice DIR1 DIR2 | save-fail-rank-2 DIR | load DIR\n";
    return 2;
  } catch (const std::exception& e) {
    say(std::string("exception: ") + e.what());
    return 2;
  }
}
