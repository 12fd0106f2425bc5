// Parsing, error reporting and exit codes shared by every `meshrun` command (see command.h).
#include "client/command.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/escaped_log.h"

namespace meshrun::client {

namespace {

std::string OneLine(std::string text) {
  for (char& ch : text) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

// The first word of a CLI11 message that names a flag ("--file is required" -> "--file").
std::string FlagIn(const std::string& message) {
  std::istringstream words(message);
  std::string word;
  while (words >> word) {
    while (!word.empty() && (word.back() == ':' || word.back() == ',' || word.back() == '.')) {
      word.pop_back();
    }
    if (word.size() > 1 && word[0] == '-') return word;
  }
  return "";
}

// CLI11's message reworded as `<flag>: <what> (hint: ...)`.
std::string DescribeParseError(const CLI::ParseError& e, const CLI::App& app) {
  std::string what = OneLine(e.what());
  std::string help = "meshrun --help";
  for (const CLI::App* sub : app.get_subcommands()) help = "meshrun " + sub->get_name() + " --help";
  const std::string hint = " (hint: run '" + help + "')";

  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    const size_t colon = what.find(": ");
    const std::string extras = colon == std::string::npos ? what : what.substr(colon + 2);
    return extras + ": unexpected argument" + hint;
  }
  std::string flag = FlagIn(what);
  if (flag.empty()) {
    if (app.get_subcommands().empty()) {
      const std::vector<std::string> rest = app.remaining();
      if (!rest.empty() && !rest.front().empty() && rest.front()[0] != '-') {
        return rest.front() + ": unknown command" + hint;
      }
      return "meshrun: a command is required" + hint;
    }
    return app.get_subcommands().back()->get_name() + ": " + what + hint;
  }
  // Drop the flag from the front of the message when CLI11 starts with it.
  if (what.rfind(flag, 0) == 0) {
    what = what.substr(flag.size());
    while (!what.empty() && (what[0] == ':' || what[0] == ' ')) what.erase(0, 1);
  }
  if (what == "is required") what = "is required but was not given";
  return flag + ": " + what + hint;
}

}  // namespace

int ReportError(const Status& status) {
  // The message may come from the coordinator and quote what a client or a worker sent.
  std::cerr << "error: " << EscapeText(OneLine(status.message()), /*keep_tab=*/false) << std::endl;
  return ExitCodeFor(status);
}

CLI::Validator WholeNumber(int64_t lo, int64_t hi) {
  const bool unbounded = hi == INT64_MAX;
  const std::string range = unbounded ? std::to_string(lo) + " or more"
                                      : "from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        size_t used = 0;
        long long value = 0;
        try {
          value = std::stoll(text, &used, 10);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) {
          return "'" + text + "' is not a whole number " + range;
        }
        if (value < lo || value > hi) {
          return std::to_string(value) + " is out of range: a whole number " + range;
        }
        return "";
      },
      unbounded ? "INT>=" + std::to_string(lo)
                : "INT in [" + std::to_string(lo) + "-" + std::to_string(hi) + "]");
}

int RunCommandLine(CLI::App& app, int argc, char** argv, CommandResult& result) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("meshrun"));
  SetEscapedLogPattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %*");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << DescribeParseError(e, app) << std::endl;
    return kExitInvalidInput;
  }
  if (!result.run) {
    std::cerr << "error: meshrun: a command is required (hint: run 'meshrun --help')" << std::endl;
    return kExitInvalidInput;
  }
  try {
    return result.run();
  } catch (const std::exception& e) {
    std::cerr << "error: internal: " << EscapeText(OneLine(e.what()), /*keep_tab=*/false)
              << std::endl;
  } catch (...) {
    std::cerr << "error: internal: unknown exception" << std::endl;
  }
  return kExitFailure;
}

}  // namespace meshrun::client
