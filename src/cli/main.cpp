// dsaserve: one binary, one subcommand per tool (inspect, score, tokenize, serve, plan, ...).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <map>

#include "cli/command.h"
#include "cli/stdout_io.h"
#include "core/error.h"
#include "core/parallel.h"

namespace dsaserve::cli {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}
}  // namespace dsaserve::cli

int main(int argc, char** argv) {
  using namespace dsaserve::cli;
  // A write to a peer that is gone (a Gloo pair to a killed rank, a closed stdout) fails with EPIPE and is
  // reported as an error, as Python-based servers do, instead of SIGPIPE ending the process silently (a
  // rank dying of SIGPIPE would also hide which peer died first). Inherited by the ranks it launches.
  std::signal(SIGPIPE, SIG_IGN);
  // Log lines (errors print as one: "error: <what, naming file/tensor/field>") go to stderr; stdout
  // carries only the commands' output.
  spdlog::set_default_logger(spdlog::stderr_color_mt("dsaserve"));
  spdlog::set_pattern("%^%l%$: %v");
  CLI::App app{"dsaserve: a native inference server for MLA + DSA + MoE models (GLM-5.x, DeepSeek-V3.2)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dsaserve 0.1.0");
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  std::map<CLI::App*, CommandRun> runs;
  std::vector<std::pair<CLI::App*, const Command*>> subs;
  for (const Command& c : cmds) subs.emplace_back(app.add_subcommand(c.name, c.help), &c);
  for (auto& [sub, c] : subs) runs[sub] = c->setup(*sub);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // The CPU operators' thread count from the environment (a subcommand's --threads overrides it): read
  // here, the one place the binary consults the environment for it.
  if (const char* e = std::getenv("DSASERVE_THREADS")) {
    const int n = std::atoi(e);
    if (n > 0) dsaserve::set_num_threads(n);
  }
  try {
    for (auto& [sub, run] : runs) {
      if (!sub->parsed()) continue;
      const int status = run();
      // Output that could not be written (a closed pipe, a full disk) is a failure, not a silent success with
      // a truncated result (what coreutils' close_stdout does): every command's stdout is checked here.
      if (status == 0) flush_stdout();
      return status;
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 2;
}
