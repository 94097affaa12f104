// Helpers shared by all test folders: temporary directories, running commands, and the
// oracle policy (a missing oracle is a clear skip for a user, a failure in CI).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace shardpoint::testing {

// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "shardpoint-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout only; redirect 2>&1 in the command to capture stderr
};

// Runs a shell command and captures its stdout.
inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `s` as one single-quoted shell word.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline std::size_t line_count(const std::string& s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

// "<name>-<pid>-<n>": unique to this process and call, for names on a server that several
// test processes share (object-store prefixes).
inline std::string unique_name(const std::string& name) {
  static std::atomic<int> n{0};
  return name + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

inline bool oracles_required() {
  const char* v = std::getenv("SHARDPOINT_REQUIRE_ORACLES");
  return v != nullptr && std::string(v) == "1";
}

// Debian's PyTorch 1.13 (/usr/bin/python3 with torch). Returns the interpreter path, or
// skips the test (fails it when SHARDPOINT_REQUIRE_ORACLES=1).
#define SP_REQUIRE_TORCH113(python_var)                                                                   \
  std::string python_var = "/usr/bin/python3";                                                            \
  if (::shardpoint::testing::run_command(python_var + " -c 'import torch' 2>/dev/null").exit_code != 0) { \
    if (::shardpoint::testing::oracles_required())                                                        \
      FAIL() << "oracle missing: /usr/bin/python3 with torch (python3-torch)";                            \
    GTEST_SKIP() << "oracle missing: /usr/bin/python3 with torch (apt-get install python3-torch)";        \
  }

// The PyTorch 2.6 oracle: scripts/oracle-python runs python3 of the Debian trixie root built by
// scripts/setup-oracle.sh (make oracle), with host paths unchanged. Sets runner_var to the
// runner's path (use it like a python3 interpreter), or skips the test when the root is missing
// or unusable (fails it when SHARDPOINT_REQUIRE_ORACLES=1).
#define SP_REQUIRE_TORCH26(runner_var)                                                                               \
  std::string runner_var = std::string(SP_SOURCE_DIR) + "/scripts/oracle-python";                                    \
  if (::shardpoint::testing::run_command(                                                                            \
          runner_var +                                                                                               \
          " -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith(\"2.6\") else 1)' 2>/dev/null")        \
          .exit_code != 0) {                                                                                         \
    if (::shardpoint::testing::oracles_required())                                                                   \
      FAIL() << "oracle missing: PyTorch 2.6 root (" << runner_var << " -c 'import torch' failed; run make oracle)"; \
    GTEST_SKIP() << "oracle missing: PyTorch 2.6 root; run `make oracle` (scripts/setup-oracle.sh, as root)";        \
  }

}  // namespace shardpoint::testing
