// Starting the ranks of a job on this machine as torchrun does: `shardpoint-train --devices N`
// and the multi-process tests (tests/launch_ranks.h) both go through launch_ranks().
//
//   comm::LaunchOptions options;
//   options.timeout = std::chrono::seconds(120);      // 0: wait as long as it takes
//   auto results = comm::launch_ranks({"/path/to/worker", "collectives"}, 4, options);
//   for (const auto& r : results) if (r.exit_code != 0) std::cerr << r.describe();
//
// Rank r gets torchrun's variables: RANK=r, LOCAL_RANK=r, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT. The port comes from reserve_port(): a port in 21000-28999 (outside the kernel's
// ephemeral range, so outgoing connections never take it) that could be bound just now and
// that no other shardpoint launcher on this machine holds: each launcher holds an flock on
// /tmp/shardpoint-ports/<port>.lock for the whole job, so jobs started at the same moment
// never share a port. A foreign program can still take the port between the check and rank
// 0's bind; when output is captured and rank 0 then reports "Address already in use", the job
// is run again on another port.
// POSIX only (posix_spawn, waitpid, flock); no LibTorch.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace shardpoint::comm {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

struct ProcessResult {
  int exit_code = -1;      // exit status; -1 when killed by a signal
  int signal = 0;          // the terminating signal, 0 when it exited
  bool timed_out = false;  // killed by the launcher at the timeout
  double seconds = 0;      // wall time from start to exit
  std::string output;      // stdout and stderr, interleaved (when captured)

  // "exit code 3 after 1.2 s; output:\n..." (with "TIMED OUT (killed)" first when it was).
  std::string describe() const;
};

struct Command {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  EnvVars env;                    // set (or override) in the child's environment
};

struct RunOptions {
  // For all processes together; those still running then are killed. 0: no limit.
  std::chrono::milliseconds timeout{0};
  // true: each process's stdout+stderr go to ProcessResult::output (stdin is /dev/null), and
  // each runs in its own process group, killed as a whole at the timeout. false: they share
  // this process's stdin/stdout/stderr and process group (Ctrl-C reaches every rank).
  bool capture_output = true;
};

// Runs all commands at once and waits for all of them. Results are in command order; a
// command that cannot be started has exit code 127 and says why in its output.
std::vector<ProcessResult> run_processes(const std::vector<Command>& commands, const RunOptions& options);

// A TCP port held for one job; see the file comment. Move-only; released on destruction.
class PortReservation {
 public:
  PortReservation() = default;
  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation();

  int port() const { return port_; }

 private:
  friend PortReservation reserve_port();
  int port_ = 0;
  int lock_fd_ = -1;  // flock'ed /tmp/shardpoint-ports/<port>.lock; -1 where locks are unavailable
};

// Throws CommError when no port in 21000-28999 is free after 200 tries.
PortReservation reserve_port();

// torchrun's variables for one rank of a single-node job.
EnvVars torchrun_env(int rank, int world_size, const std::string& master_addr, int master_port);

struct LaunchOptions : RunOptions {
  EnvVars env;  // extra variables for every rank
  std::string master_addr = "127.0.0.1";
  int master_port = 0;    // 0: reserve_port() (and retry on "Address already in use")
  int port_attempts = 3;  // jobs run at most, counting retries
};

// Starts `world_size` copies of argv as ranks 0..world_size-1 and waits for all (killing
// stragglers at the timeout). Results indexed by rank.
std::vector<ProcessResult> launch_ranks(const std::vector<std::string>& argv, int world_size,
                                        const LaunchOptions& options);

}  // namespace shardpoint::comm
