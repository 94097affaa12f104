// Multi-process test helpers: start processes (the ranks of a job, or a launcher like mpirun),
// capture their stdout+stderr, and kill whatever is still running at the timeout, so a hung
// rank fails the test instead of hanging ctest.
//
//   auto ranks = launch_ranks(SP_BINARY_DIR "/tests/comm/comm_worker", {"collectives"}, 4);
//   for (const auto& r : ranks) EXPECT_EQ(r.exit_code, 0) << r.describe();
//
//   ProcessResult mpi = run_process({"mpirun", "-np", "4", worker, "collectives"},
//                                   mpirun_root_env(), std::chrono::seconds(120));
//
// launch_ranks sets torchrun's variables for rank r: RANK=r, LOCAL_RANK=r, WORLD_SIZE,
// MASTER_ADDR (127.0.0.1), MASTER_PORT (random free port in 21000-28999, outside the kernel's
// ephemeral range). When rank 0 reports "Address already in use" it retries with another port.
// Each process runs in its own process group; at the timeout the whole group gets SIGKILL.
// Header-only; POSIX (posix_spawn, waitpid).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace shardpoint::testing {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

struct ProcessResult {
  int exit_code = -1;      // exit status; -1 when killed by a signal
  int signal = 0;          // the terminating signal, 0 when it exited
  bool timed_out = false;  // killed by the launcher at the timeout
  double seconds = 0;      // wall time from start to exit
  std::string output;      // stdout and stderr, interleaved

  std::string describe() const {
    std::ostringstream s;
    if (timed_out) s << "TIMED OUT (killed) ";
    if (signal != 0) s << "killed by signal " << signal;
    else s << "exit code " << exit_code;
    s << " after " << seconds << " s; output:\n" << output;
    return s.str();
  }
};

struct Command {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH when it has no '/'
  EnvVars env;                    // set (or override) in the child's environment
};

// A port on 127.0.0.1 in [21000, 28999] that could be bound just now.
inline int pick_free_port() {
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  std::uniform_int_distribution<int> dist(21000, 28999);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = dist(rng);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (ok) return port;
  }
  throw std::runtime_error("pick_free_port: no free port in 21000-28999");
}

// Runs all commands at once and waits for all of them, at most `timeout` in total; processes
// still running then are killed (their whole process group). Results are in command order.
inline std::vector<ProcessResult> run_processes(const std::vector<Command>& commands,
                                                std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  std::vector<ProcessResult> results(commands.size());
  std::vector<pid_t> pids(commands.size(), -1);
  std::vector<std::string> out_paths(commands.size());

  for (std::size_t i = 0; i < commands.size(); ++i) {
    const Command& cmd = commands[i];
    std::string tmpl = (std::filesystem::temp_directory_path() / "shardpoint-proc-XXXXXX").string();
    const int out_fd = ::mkstemp(tmpl.data());
    if (out_fd < 0) throw std::runtime_error("run_processes: mkstemp failed");
    out_paths[i] = tmpl;

    // Environment: ours, minus the overridden names, plus the overrides.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry(*e);
      const std::string name = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const auto& [k, v] : cmd.env) overridden = overridden || k == name;
      if (!overridden) env_strings.push_back(std::move(entry));
    }
    for (const auto& [k, v] : cmd.env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = cmd.argv;
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
    posix_spawn_file_actions_adddup2(&actions, out_fd, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t no_signals, default_signals;
    sigemptyset(&no_signals);
    sigemptyset(&default_signals);
    sigaddset(&default_signals, SIGPIPE);
    posix_spawnattr_setsigmask(&attr, &no_signals);
    posix_spawnattr_setsigdefault(&attr, &default_signals);
    posix_spawnattr_setpgroup(&attr, 0);  // own process group: killed as a whole at the timeout
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(out_fd);
    if (rc != 0) {
      results[i].output = "run_processes: cannot start " + cmd.argv[0] + ": " + std::strerror(rc) + "\n";
      results[i].exit_code = 127;
    } else {
      pids[i] = pid;
    }
  }

  std::size_t running = 0;
  for (pid_t p : pids) running += p > 0 ? 1 : 0;
  bool killed = false;
  while (running > 0) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0) continue;
      int status = 0;
      const pid_t r = ::waitpid(pids[i], &status, killed ? 0 : WNOHANG);
      if (r == 0) continue;
      if (r == pids[i]) {
        results[i].seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (WIFEXITED(status)) results[i].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[i].signal = WTERMSIG(status);
      }
      ::kill(-pids[i], SIGKILL);  // leftovers of its process group, if any
      pids[i] = -1;
      --running;
    }
    if (running == 0) break;
    if (!killed && Clock::now() >= deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] > 0) {
          ::kill(-pids[i], SIGKILL);
          results[i].timed_out = true;
        }
      }
      killed = true;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  for (std::size_t i = 0; i < commands.size(); ++i) {
    if (out_paths[i].empty()) continue;
    std::ifstream in(out_paths[i], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    results[i].output += ss.str();
    std::filesystem::remove(out_paths[i]);
  }
  return results;
}

inline ProcessResult run_process(std::vector<std::string> argv, EnvVars env, std::chrono::milliseconds timeout) {
  return run_processes({Command{std::move(argv), std::move(env)}}, timeout).front();
}

struct LaunchOptions {
  std::chrono::milliseconds timeout = std::chrono::seconds(120);  // for the whole job
  EnvVars env;                                                   // extra variables for every rank
  std::string master_addr = "127.0.0.1";
  int master_port = 0;      // 0: pick_free_port() (and retry on "Address already in use")
  int port_attempts = 3;
};

// Starts `world_size` copies of `binary args...` as ranks 0..world_size-1 with torchrun's
// environment, waits for all (killing stragglers at the timeout). Results indexed by rank.
inline std::vector<ProcessResult> launch_ranks(const std::string& binary, const std::vector<std::string>& args,
                                               int world_size, const LaunchOptions& options = {}) {
  std::vector<ProcessResult> results;
  for (int attempt = 0; attempt < std::max(1, options.port_attempts); ++attempt) {
    const int port = options.master_port != 0 ? options.master_port : pick_free_port();
    std::vector<Command> commands;
    for (int r = 0; r < world_size; ++r) {
      Command cmd;
      cmd.argv.push_back(binary);
      cmd.argv.insert(cmd.argv.end(), args.begin(), args.end());
      cmd.env = {{"RANK", std::to_string(r)},
                 {"LOCAL_RANK", std::to_string(r)},
                 {"WORLD_SIZE", std::to_string(world_size)},
                 {"MASTER_ADDR", options.master_addr},
                 {"MASTER_PORT", std::to_string(port)}};
      cmd.env.insert(cmd.env.end(), options.env.begin(), options.env.end());
      commands.push_back(std::move(cmd));
    }
    results = run_processes(commands, options.timeout);
    const bool port_taken = !results.empty() && results[0].exit_code != 0 &&
                            results[0].output.find("Address already in use") != std::string::npos;
    if (!port_taken || options.master_port != 0) break;
  }
  return results;
}

// The environment OpenMPI's mpirun needs here: running as root, and more ranks than cores.
inline EnvVars mpirun_root_env() {
  return {{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
          {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
          {"OMPI_MCA_rmaps_base_oversubscribe", "1"}};
}

}  // namespace shardpoint::testing
