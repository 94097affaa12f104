// shardpoint: the command-line tool.
//
// main() calls try_main() and maps what escapes to one line on stderr and an exit code:
//   0  success
//   1  failure (a bad file, a failed check, an I/O error)
//   2  usage error (bad arguments)
// A closed stdout (broken pipe) ends the program quietly.
// --verbose (before or after the subcommand) adds one stderr line when the command ends,
// also when it failed: the HTTP client's retries by cause (storage/http/retry_stats.h), so
// a run that met throttling or broken answers from an object store says so.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "shardpoint/error.h"
#include "storage/http/retry_stats.h"

namespace shardpoint::cli {
namespace {

int try_main(int argc, char** argv, bool& verbose) {
  CLI::App app{"shardpoint: sharded checkpoints in PyTorch's distributed checkpoint (DCP) format.\n"
               "Reads and writes torch.save files and DCP folders without Python."};
  app.set_version_flag("--version", std::string("shardpoint ") + kVersion);
  app.require_subcommand(1);
  app.add_flag("-v,--verbose", verbose, "Report on stderr what the run retried (object stores)");
  app.fallthrough();  // --verbose may follow the subcommand
  std::vector<std::unique_ptr<Command>> commands = make_commands();
  for (auto& command : commands) command->add_to(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "shardpoint: " << e.what() << "\n"
              << "Run 'shardpoint --help' for usage.\n";
    return 2;
  }
  for (auto& command : commands) {
    if (command->parsed()) return command->run();
  }
  return 2;
}

void report_retries(bool verbose) {
  if (verbose)
    std::cerr << "shardpoint: " << storage::http::describe_retry_counts(storage::http::retry_counts()) << "\n";
}

}  // namespace
}  // namespace shardpoint::cli

int main(int argc, char** argv) {
  // A write to a closed pipe returns EPIPE instead of killing the process; output code
  // treats it as a quiet end.
  std::signal(SIGPIPE, SIG_IGN);
  bool verbose = false;
  try {
    int code = shardpoint::cli::try_main(argc, argv, verbose);
    std::cout.flush();
    shardpoint::cli::report_retries(verbose);
    return code;
  } catch (const shardpoint::cli::StdoutClosed&) {
    return 0;
  } catch (const shardpoint::UsageError& e) {
    shardpoint::cli::report_retries(verbose);
    std::cerr << "shardpoint: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    shardpoint::cli::report_retries(verbose);
    std::cerr << "shardpoint: " << e.what() << "\n";
    return 1;
  }
}
