// ThreadGroup: a job of N ranks as N threads of one process, each with its own Communicator,
// for engine and planner tests that need real collectives without processes or sockets
// (engine tests pair it with MemoryStorage).
//
//   ThreadGroup group(4, {.timeout = std::chrono::seconds(5)});
//   group.run([&](Communicator& comm) {
//     auto all = comm.all_gather(std::to_string(comm.rank()));
//     ...
//   });
//
// Failure semantics (what a multi-process job would see, only faster):
//   - A rank whose function throws aborts the group: ranks blocked in, or later entering, a
//     collective throw CommError ("... rank 2 failed: <what>") at once.
//   - A rank whose function returns while others wait for it in a collective makes them throw
//     CommError at once ("rank 3 left the group without joining ...").
//   - A collective not joined by every rank within its timeout throws CommError on the waiting
//     ranks and aborts the group.
//   - Ranks that call different collectives (or the same one with different roots) at the same
//     step all throw CommError naming each rank's call.
//
// Thread-safety: a ThreadGroup runs one run()/run_all() at a time (calls from several threads
// are serialized). Each rank's Communicator follows communicator.h: use it from its rank's
// thread (or threads it joins) and not after run() returns.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "shardpoint/communicator.h"
#include "shardpoint/mutex.h"

namespace shardpoint::comm {

class ThreadGroup {
 public:
  // REQUIRES: world_size >= 1 (else UsageError).
  explicit ThreadGroup(int world_size, CommOptions options = {});
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int world_size() const { return world_size_; }

  // Runs fn(comm) on world_size threads (rank r's comm has rank() == r) and joins them all.
  // Blocks until every thread returned. If any rank threw, rethrows the exception of the rank
  // whose failure came first (the root cause, not the CommErrors it caused in the others).
  void run(const std::function<void(Communicator&)>& fn);

  // As run(), but returns each rank's exception (nullptr when it returned), indexed by rank.
  std::vector<std::exception_ptr> run_all(const std::function<void(Communicator&)>& fn);

  struct State;  // the rendezvous of the ranks; defined in the .cc

 private:
  const int world_size_;
  const CommOptions options_;
  Mutex run_mutex_;  // one run at a time
  std::unique_ptr<State> state_;
};

}  // namespace shardpoint::comm
