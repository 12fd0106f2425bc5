// `meshrun completion` (see completion_command.h).
#include "client/completion_command.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>

namespace meshrun::client {
namespace {

// The bash completion function: the command at word 1, then that command's flags for a word
// starting with '-', else file names (specs, checkpoints, folders).
std::string BashScript(const CLI::App& app) {
  std::string commands, cases;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    commands += (commands.empty() ? "" : " ") + sub->get_name();
    std::string flags = "--help";
    for (const CLI::Option* opt : sub->get_options()) {
      for (const std::string& s : opt->get_snames()) flags += " -" + s;
      for (const std::string& l : opt->get_lnames()) {
        if (l != "help") flags += " --" + l;
      }
    }
    cases += "    " + sub->get_name() + ") opts=\"" + flags + "\" ;;\n";
  }
  return "# meshrun completion for bash (meshrun completion bash); for zsh: meshrun completion "
         "zsh\n"
         "_meshrun() {\n"
         "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" opts=\"\"\n"
         "  if [[ $COMP_CWORD -eq 1 ]]; then\n"
         "    COMPREPLY=($(compgen -W \"" +
         commands +
         " --help --version\" -- \"$cur\"))\n"
         "    return\n"
         "  fi\n"
         "  case \"${COMP_WORDS[1]}\" in\n" +
         cases +
         "  esac\n"
         "  if [[ $cur == -* ]]; then\n"
         "    COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))\n"
         "  else\n"
         "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "  fi\n"
         "}\n"
         "complete -o filenames -F _meshrun meshrun\n";
}

}  // namespace

void RegisterCompletionCommand(CLI::App& app, CommandResult& result) {
  auto shell = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "completion", "Print a shell completion script: source <(meshrun completion bash)");
  cmd->add_option("SHELL", *shell, "bash or zsh")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh"}));
  CLI::App* root = &app;
  cmd->callback([shell, root, &result] {
    result.run = [shell, root] {
      // zsh runs the bash function through its bashcompinit layer.
      if (*shell == "zsh") std::cout << "autoload -U +X bashcompinit && bashcompinit\n";
      std::cout << BashScript(*root) << std::flush;
      return kExitOk;
    };
  });
}

}  // namespace meshrun::client
