// A test server run as a child of the test process on 127.0.0.1: started from a shell
// command, waited for until its port accepts connections, killed by PID (also when the test
// process dies without running destructors: PR_SET_PDEATHSIG). Used by the servers the
// storage tests start from binaries and scripts (moto, s3s-fs, fake-gcs-server).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

namespace shardpoint::storage::testing {

// True when something accepts TCP connections on 127.0.0.1:port (a test server is up).
inline bool accepting(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// SIGKILLs and reaps *pid when it is a child still running; sets it to -1. Idempotent.
inline void kill_server_process(pid_t* pid) {
  if (*pid > 0) {
    ::kill(*pid, SIGKILL);
    int status = 0;
    ::waitpid(*pid, &status, 0);
    *pid = -1;
  }
}

// Runs `sh -c "exec COMMAND >LOG 2>&1"` as a child and waits up to 30 s for 127.0.0.1:port
// to accept connections. Returns the child's PID, or -1 with *why set (naming `what` and the
// log) when the child exited first or the port stayed closed (the child is then killed).
inline pid_t start_server_process(const std::string& what, const std::string& command, int port, const std::string& log,
                                  std::string* why) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the test process
    const std::string cmd = "exec " + command + " >'" + log + "' 2>&1";
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (pid < 0) {
    *why = "fork for " + what + " failed";
    return -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!accepting(port)) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      *why = what + " exited at start (log: " + log + ")";
      return -1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      *why = what + " did not accept connections on port " + std::to_string(port) + " within 30 s (log: " + log + ")";
      kill_server_process(&pid);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pid;
}

}  // namespace shardpoint::storage::testing
