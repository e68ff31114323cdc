#pragma once
// Subcommands of the `dsaserve` binary. Each cmd_<name>.cpp registers itself with a static
// CommandRegistration; setup adds its options to the CLI11 subcommand and returns the function that
// runs it after parsing (its return value is the exit status).
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace dsaserve::cli {

using CommandRun = std::function<int()>;
using CommandSetup = std::function<CommandRun(CLI::App& sub)>;

struct Command {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<Command>& commands();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string help, CommandSetup setup) {
    commands().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace dsaserve::cli
