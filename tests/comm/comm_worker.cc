// comm_worker: one rank of a multi-process Communicator test. The communicator comes from
// make_communicator_from_env(), so the same binary runs under launch_ranks (Gloo: RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and under mpirun (MPI).
//
//   comm_worker SCENARIO [--timeout-ms N]
//
// Scenarios:
//   collectives  every collective with checked results (variable sizes, empty and 3 MiB
//                payloads, every root); prints "rank R: collectives ok".
//   die          after a first barrier the last rank exits at once (exit code 3); the others
//                call barrier and must get CommError ("rank R: got CommError after N ms: ...").
//   slow         the last rank sleeps 4 x timeout before the barrier; the others must get a
//                CommError naming the timeout; the slow rank then gets one too (peers gone).
//   die-first    as die, but rank 0 (the coordinator) is the one that exits.
//   libraries    prints "rank R: libtorch loaded: yes|no" (from /proc/self/maps) after a barrier.
//   mismatch     after a first barrier the last rank calls gather, the others barrier; every
//                rank must get a CommError (drivers that detect it: threads, tcp).
// Exit codes: 0 = behaved as expected, 1 = a check failed, 2 = unexpected exception,
// 3 = the rank that dies on purpose. Every output line starts with "rank R: ".
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "shardpoint/communicator_from_env.h"
#include "shardpoint/error.h"

namespace sc = shardpoint::comm;
using Clock = std::chrono::steady_clock;

namespace {

int g_rank = -1;

void say(const std::string& line) {
  std::ostringstream s;
  s << "rank " << g_rank << ": " << line << "\n";
  std::cout << s.str() << std::flush;
}

struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define CHECK_TRUE(cond, what)                                                                   \
  do {                                                                                           \
    if (!(cond)) throw CheckFailed(std::string("check failed: ") + #cond + " (" + (what) + ")"); \
  } while (0)

// Deterministic bytes for (rank, size), zero bytes included.
std::string payload(int rank, std::size_t size) {
  std::string s(size, '\0');
  for (std::size_t i = 0; i < size; ++i) s[i] = static_cast<char>((rank * 131 + i * 7) & 0xff);
  return s;
}

std::size_t size_for(int rank) { return rank == 1 ? 0 : static_cast<std::size_t>(rank) * 37 + 5; }

void run_collectives(sc::Communicator& comm) {
  const int n = comm.world_size();
  const int me = comm.rank();
  comm.barrier();

  for (int root = 0; root < n; ++root) {
    std::string got = comm.broadcast(me == root ? payload(root, size_for(root)) : "ignored", root);
    CHECK_TRUE(got == payload(root, size_for(root)), "broadcast from root " + std::to_string(root));
  }
  CHECK_TRUE(comm.broadcast("", 0).empty(), "empty broadcast");

  const int gather_root = n - 1;
  std::vector<std::string> gathered = comm.gather(payload(me, size_for(me)), gather_root);
  if (me == gather_root) {
    CHECK_TRUE(static_cast<int>(gathered.size()) == n, "gather size");
    for (int r = 0; r < n; ++r) CHECK_TRUE(gathered[r] == payload(r, size_for(r)), "gather item " + std::to_string(r));
  } else {
    CHECK_TRUE(gathered.empty(), "gather on non-root");
  }

  const std::size_t big = 3u << 20;
  std::vector<std::string> all = comm.all_gather(payload(me, me == 0 ? big : size_for(me)));
  CHECK_TRUE(static_cast<int>(all.size()) == n, "all_gather size");
  for (int r = 0; r < n; ++r) {
    CHECK_TRUE(all[r] == payload(r, r == 0 ? big : size_for(r)), "all_gather item " + std::to_string(r));
  }
  std::vector<std::string> empties = comm.all_gather("");
  CHECK_TRUE(static_cast<int>(empties.size()) == n && empties[0].empty(), "all_gather of empty strings");

  std::vector<std::string> pieces;
  if (me == 0) {
    for (int r = 0; r < n; ++r) pieces.push_back(payload(100 + r, size_for(r) * 3));
  }
  std::string piece = comm.scatter(pieces, 0);
  CHECK_TRUE(piece == payload(100 + me, size_for(me) * 3), "scatter piece");

  CHECK_TRUE(comm.all_reduce(std::int64_t{me + 1}, sc::ReduceOp::kSum) == std::int64_t{n} * (n + 1) / 2, "int sum");
  CHECK_TRUE(comm.all_reduce(std::int64_t{me} - 5, sc::ReduceOp::kMin) == -5, "int min");
  CHECK_TRUE(comm.all_reduce(std::int64_t{1} << (40 + me), sc::ReduceOp::kMax) == std::int64_t{1} << (40 + n - 1),
             "int max");
  CHECK_TRUE(comm.all_reduce(0.5 * me, sc::ReduceOp::kSum) == 0.25 * n * (n - 1), "double sum");
  CHECK_TRUE(comm.all_reduce(-1.5 * me, sc::ReduceOp::kMin) == -1.5 * (n - 1), "double min");
  CHECK_TRUE(comm.all_reduce(2.0 + me, sc::ReduceOp::kMax) == 2.0 + (n - 1), "double max");

  CHECK_TRUE(comm.all_ok(true), "all_ok(true)");
  CHECK_TRUE(!comm.all_ok(me != n - 1), "all_ok with one failing rank");

  std::vector<sc::RankError> errors = comm.all_errors(me == n - 1 ? "disk full" : "");
  CHECK_TRUE(errors.size() == 1 && errors[0].rank == n - 1 && errors[0].message == "disk full", "all_errors");

  comm.rethrow_if_any_failed(nullptr);  // nobody failed: returns
  std::exception_ptr local;
  if (me == n - 1) {
    local = std::make_exception_ptr(
        shardpoint::StorageError(shardpoint::StorageError::Kind::kNoSpace, "write /ckpt/x: no space"));
  }
  try {
    comm.rethrow_if_any_failed(local);
    CHECK_TRUE(false, "rethrow_if_any_failed did not throw");
  } catch (const shardpoint::StorageError& e) {
    CHECK_TRUE(e.kind() == shardpoint::StorageError::Kind::kNoSpace, e.what());
    const std::string expected =
        me == n - 1 ? "write /ckpt/x: no space" : "rank " + std::to_string(n - 1) + ": write /ckpt/x: no space";
    CHECK_TRUE(e.what() == expected, e.what());
  }
  comm.barrier();
  say("collectives ok (" + std::string(comm.name()) + ", world " + std::to_string(n) + ")");
}

// Expects `fn` to throw CommError; prints it and ends the process with 0 (skipping destructors
// and MPI_Finalize: the group is broken, as in a real failure).
template <typename Fn>
[[noreturn]] void expect_comm_error(Fn fn) {
  const auto start = Clock::now();
  try {
    fn();
  } catch (const shardpoint::CommError& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    say("got CommError after " + std::to_string(ms) + " ms: " + e.what());
    std::_Exit(0);
  }
  say("expected a CommError, the call returned normally");
  std::_Exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: comm_worker collectives|die|die-first|slow|mismatch [--timeout-ms N]\n";
    return 2;
  }
  const std::string scenario = argv[1];
  sc::CommOptions options;
  options.timeout = std::chrono::seconds(60);
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--timeout-ms") options.timeout = std::chrono::milliseconds(std::atoll(argv[i + 1]));
  }
  try {
    std::unique_ptr<sc::Communicator> comm = sc::make_communicator_from_env(options);
    g_rank = comm->rank();
    const int last = comm->world_size() - 1;
    if (scenario == "collectives") {
      run_collectives(*comm);
    } else if (scenario == "die") {
      comm->barrier();
      if (comm->rank() == last) {
        say("dying");
        std::_Exit(3);
      }
      expect_comm_error([&] { comm->barrier(); });
    } else if (scenario == "die-first") {
      comm->barrier();
      if (comm->rank() == 0) {
        say("dying");
        std::_Exit(3);
      }
      expect_comm_error([&] { comm->barrier(); });
    } else if (scenario == "libraries") {
      comm->barrier();
      std::ifstream maps("/proc/self/maps");
      std::string line;
      bool torch = false;
      while (std::getline(maps, line)) torch = torch || line.find("libtorch") != std::string::npos;
      say(std::string("libtorch loaded: ") + (torch ? "yes" : "no") + " (" + std::string(comm->name()) + ")");
    } else if (scenario == "mismatch") {
      comm->barrier();
      if (comm->rank() == last) {
        expect_comm_error([&] { comm->gather("x", 0); });
      }
      expect_comm_error([&] { comm->barrier(); });
    } else if (scenario == "slow") {
      comm->barrier(std::chrono::seconds(60));
      if (comm->rank() == last) {
        std::this_thread::sleep_for(options.timeout * 4);
        say("slept, now joining the barrier");
      }
      expect_comm_error([&] { comm->barrier(); });
    } else {
      std::cerr << "comm_worker: unknown scenario " << scenario << "\n";
      return 2;
    }
  } catch (const CheckFailed& e) {
    say(e.what());
    return 1;
  } catch (const std::exception& e) {
    say(std::string("unexpected exception: ") + e.what());
    return 2;
  }
  return 0;
}
