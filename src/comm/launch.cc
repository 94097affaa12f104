#include "comm/launch.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "shardpoint/error.h"

namespace shardpoint::comm {
namespace {

constexpr int kFirstPort = 21000;
constexpr int kLastPort = 28999;
constexpr const char* kPortLockDir = "/tmp/shardpoint-ports";

// This process's environment, minus the names `overrides` sets, plus the overrides.
std::vector<std::string> child_environment(const EnvVars& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    const bool overridden =
        std::any_of(overrides.begin(), overrides.end(), [&](const auto& kv) { return kv.first == name; });
    if (!overridden) env.push_back(std::move(entry));
  }
  for (const auto& [k, v] : overrides) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Starts one command; returns its pid, or -1 with the reason in result.output.
pid_t spawn(const Command& cmd, const RunOptions& options, int out_fd, ProcessResult& result) {
  std::vector<std::string> env_strings = child_environment(cmd.env);
  std::vector<std::string> args = cmd.argv;
  std::vector<char*> envp = c_strings(env_strings);
  std::vector<char*> argv = c_strings(args);
  const std::string& program = cmd.argv.at(0);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t no_signals, default_signals;
  sigemptyset(&no_signals);
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &no_signals);
  posix_spawnattr_setsigdefault(&attr, &default_signals);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (options.capture_output) {
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
    posix_spawn_file_actions_adddup2(&actions, out_fd, 2);
    posix_spawnattr_setpgroup(&attr, 0);  // own process group: killed as a whole at the timeout
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attr, flags);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, program.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc == 0) return pid;
  result.output = fmt::format("run_processes: cannot start {}: {}\n", program, std::strerror(rc));
  result.exit_code = 127;
  return -1;
}

// A temporary file for one process's output; its path is returned in `path`.
int open_output_file(std::string& path) {
  path = (std::filesystem::temp_directory_path() / "shardpoint-proc-XXXXXX").string();
  const int fd = ::mkstemp(path.data());
  if (fd < 0) throw CommError(fmt::format("run_processes: cannot create {}: {}", path, std::strerror(errno)));
  return fd;
}

std::string take_output_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::filesystem::remove(path);
  return ss.str();
}

void kill_process(pid_t pid, const RunOptions& options) { ::kill(options.capture_output ? -pid : pid, SIGKILL); }

// Waits for every started pid (marked -1 once reaped), killing the rest at the deadline.
void wait_all(std::vector<pid_t>& pids, std::vector<ProcessResult>& results, const RunOptions& options) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const bool has_deadline = options.timeout.count() > 0;
  const auto deadline = start + options.timeout;
  std::size_t running = std::count_if(pids.begin(), pids.end(), [](pid_t p) { return p > 0; });
  bool killed = false;
  while (running > 0) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0) continue;
      int status = 0;
      const pid_t r = ::waitpid(pids[i], &status, killed ? 0 : WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) continue;
      if (r == pids[i]) {
        results[i].seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (WIFEXITED(status)) results[i].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[i].signal = WTERMSIG(status);
      }
      if (options.capture_output) ::kill(-pids[i], SIGKILL);  // leftovers of its process group, if any
      pids[i] = -1;
      --running;
    }
    if (running == 0) break;
    if (!killed && has_deadline && Clock::now() >= deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] <= 0) continue;
        kill_process(pids[i], options);
        results[i].timed_out = true;
      }
      killed = true;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// True when `port` on 127.0.0.1 could be bound just now.
bool can_bind(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// The lock directory, created world-writable (sticky) so launchers of every user share it.
bool ensure_lock_dir() {
  if (::mkdir(kPortLockDir, 01777) == 0) {
    ::chmod(kPortLockDir, 01777);  // mkdir's mode went through the umask
    return true;
  }
  return errno == EEXIST;
}

// Takes the port's lock without waiting. Returns the locked fd, -1 when another launcher holds
// it, or -2 when locks cannot be used here (then the bind check alone decides).
int lock_port(int port) {
  const std::string path = fmt::format("{}/{}.lock", kPortLockDir, port);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return -2;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  const int err = errno;
  ::close(fd);
  return err == EWOULDBLOCK ? -1 : -2;
}

}  // namespace

std::string ProcessResult::describe() const {
  std::string s = timed_out ? "TIMED OUT (killed) " : "";
  s += signal != 0 ? fmt::format("killed by signal {}", signal) : fmt::format("exit code {}", exit_code);
  return s + fmt::format(" after {} s; output:\n{}", seconds, output);
}

std::vector<ProcessResult> run_processes(const std::vector<Command>& commands, const RunOptions& options) {
  std::vector<ProcessResult> results(commands.size());
  std::vector<pid_t> pids(commands.size(), -1);
  std::vector<std::string> out_paths(commands.size());
  for (std::size_t i = 0; i < commands.size(); ++i) {
    const int out_fd = options.capture_output ? open_output_file(out_paths[i]) : -1;
    pids[i] = spawn(commands[i], options, out_fd, results[i]);
    if (out_fd >= 0) ::close(out_fd);
  }
  wait_all(pids, results, options);
  for (std::size_t i = 0; i < commands.size(); ++i) {
    if (!out_paths[i].empty()) results[i].output += take_output_file(out_paths[i]);
  }
  return results;
}

PortReservation::PortReservation(PortReservation&& other) noexcept
    : port_(std::exchange(other.port_, 0)), lock_fd_(std::exchange(other.lock_fd_, -1)) {}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
  if (this != &other) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    port_ = std::exchange(other.port_, 0);
    lock_fd_ = std::exchange(other.lock_fd_, -1);
  }
  return *this;
}

PortReservation::~PortReservation() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

PortReservation reserve_port() {
  static thread_local std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  std::uniform_int_distribution<int> dist(kFirstPort, kLastPort);
  const bool locks = ensure_lock_dir();
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = dist(rng);
    const int lock = locks ? lock_port(port) : -2;
    if (lock == -1) continue;  // another launcher's job has it
    if (!can_bind(port)) {
      if (lock >= 0) ::close(lock);
      continue;
    }
    PortReservation reservation;
    reservation.port_ = port;
    reservation.lock_fd_ = lock >= 0 ? lock : -1;
    return reservation;
  }
  throw CommError(
      fmt::format("no free port in {}-{} for MASTER_PORT (locks in {})", kFirstPort, kLastPort, kPortLockDir));
}

EnvVars torchrun_env(int rank, int world_size, const std::string& master_addr, int master_port) {
  return {{"RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world_size)},
          {"MASTER_ADDR", master_addr},
          {"MASTER_PORT", std::to_string(master_port)}};
}

std::vector<ProcessResult> launch_ranks(const std::vector<std::string>& argv, int world_size,
                                        const LaunchOptions& options) {
  std::vector<ProcessResult> results;
  for (int attempt = 0; attempt < std::max(1, options.port_attempts); ++attempt) {
    PortReservation reservation;  // held until the job has ended
    if (options.master_port == 0) reservation = reserve_port();
    const int port = options.master_port != 0 ? options.master_port : reservation.port();
    std::vector<Command> commands;
    for (int r = 0; r < world_size; ++r) {
      Command cmd{argv, torchrun_env(r, world_size, options.master_addr, port)};
      cmd.env.insert(cmd.env.end(), options.env.begin(), options.env.end());
      commands.push_back(std::move(cmd));
    }
    results = run_processes(commands, options);
    const bool port_taken = !results.empty() && results[0].exit_code != 0 &&
                            results[0].output.find("Address already in use") != std::string::npos;
    if (!port_taken || options.master_port != 0) break;
  }
  return results;
}

}  // namespace shardpoint::comm
