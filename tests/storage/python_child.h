// The test servers written in Python (the GCS JSON server, the fault proxy) as children of
// the test process, which announce their port on stdout.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace shardpoint::storage::testing {

// Forks `python3 args...` (args[0] is "python3") with its stdout on the write end of
// `pipe_fds`, dying with the test process even when that one aborts without destructors.
// In the parent the write end is closed; the read end stays for the caller. Returns the pid
// (-1 when fork fails).
inline pid_t spawn_python3(std::vector<std::string> args, const int pipe_fds[2]) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(pipe_fds[1], 1);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("python3", argv.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  return pid;
}

}  // namespace shardpoint::storage::testing
