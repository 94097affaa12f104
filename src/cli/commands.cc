#include "cli/commands.h"

namespace shardpoint::cli {

std::unique_ptr<Command> make_inspect_command();
std::unique_ptr<Command> make_consolidate_command();
std::unique_ptr<Command> make_verify_command();
std::unique_ptr<Command> make_reshard_command();

std::vector<std::unique_ptr<Command>> make_commands() {
  std::vector<std::unique_ptr<Command>> commands;
  commands.push_back(make_inspect_command());
  commands.push_back(make_consolidate_command());
  commands.push_back(make_verify_command());
  commands.push_back(make_reshard_command());
  return commands;
}

}  // namespace shardpoint::cli
