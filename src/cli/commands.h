// The subcommands of the shardpoint CLI. Each is a small class that registers its
// options with CLI11 and runs after parsing; run() returns the exit code or throws
// (main maps exceptions to one stderr line and an exit code).
#pragma once

#include <memory>
#include <stdexcept>
#include <vector>

namespace CLI {
class App;
}

namespace shardpoint::cli {

inline constexpr const char* kVersion = "0.1.0";

class Command {
 public:
  virtual ~Command() = default;
  virtual void add_to(CLI::App& app) = 0;
  virtual bool parsed() const = 0;
  virtual int run() = 0;
};

// Thrown by output helpers when stdout is a closed pipe.
struct StdoutClosed : std::runtime_error {
  StdoutClosed() : std::runtime_error("stdout closed") {}
};

// Writes s to stdout; throws StdoutClosed on EPIPE.
void print_out(const std::string& s);

std::vector<std::unique_ptr<Command>> make_commands();

}  // namespace shardpoint::cli
