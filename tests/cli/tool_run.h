// Runs the `shardpoint` command of this build (SP_SHARDPOINT) for the CLI tests, with its
// stdout and stderr captured apart.
#pragma once

#include <filesystem>
#include <string>

#include "test_util.h"

namespace shardpoint::testing {

struct ToolRun {
  int code = -1;    // exit code
  std::string out;  // stdout
  std::string err;  // stderr
};

// `shardpoint ARGS` (ARGS already shell-quoted); stderr goes through a file in `scratch`.
inline ToolRun run_tool(const std::string& args, const TempDir& scratch) {
  const std::string err_file = scratch.file("stderr.txt");
  CommandResult r = run_command(std::string(SP_SHARDPOINT) + " " + args + " 2>" + shell_quote(err_file));
  ToolRun out{r.exit_code, r.output, read_text(err_file)};
  std::filesystem::remove(err_file);
  return out;
}

}  // namespace shardpoint::testing
