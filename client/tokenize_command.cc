// `meshrun tokenize`: the inputs read as data.train reads a text folder (the same files, the
// same order, the end-of-text token between files), tokenized in parallel over files, written
// as llm.c version 1 (uint16) or, for vocabularies over 65,535, version 2 (uint32).
#include "client/tokenize_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "client/command.h"
#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"

namespace meshrun::client {
namespace {

struct TokenizeFlags {
  std::string tokenizer, output;
  std::vector<std::string> inputs;
  int threads = 0;
  bool quiet = false;
};

int RunTokenize(const TokenizeFlags& o) {
  StatusOr<std::shared_ptr<const Tokenizer>> tokenizer = Tokenizer::Load(o.tokenizer);
  if (!tokenizer.ok()) {
    std::string m = tokenizer.status().message();
    if (m.rfind("data.tokenizer: ", 0) == 0) m = "--tokenizer: " + m.substr(16);
    return ReportError(Status(tokenizer.status().code(), m));
  }
  LoadOptions options;
  options.threads = o.threads;
  // A progress bar on a terminal: MB done of MB in all, redrawn at most 10 times a second.
  const bool terminal = !o.quiet && isatty(STDERR_FILENO);
  std::mutex mu;
  auto last = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  const auto start = std::chrono::steady_clock::now();
  if (terminal) {
    options.progress = [&](int64_t done, int64_t total) {
      std::lock_guard<std::mutex> lock(mu);
      const auto now = std::chrono::steady_clock::now();
      if (done < total && now - last < std::chrono::milliseconds(100)) return;
      last = now;
      const int width = 30;
      const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
      const double secs = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "\r[%s%s] %.1f/%.1f MB  %.1f MB/s", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), done / 1e6, total / 1e6,
                   secs > 0 ? done / 1e6 / secs : 0.0);
      std::fflush(stderr);
    };
  }
  StatusOr<TokenStream> stream = TokenizeTexts(o.inputs, *tokenizer, options);
  if (terminal) std::fprintf(stderr, "\n");
  if (!stream.ok()) return ReportError(stream.status());
  if (Status s = WriteLlmcTokens(o.output, stream->tokens, (*tokenizer)->vocab_size()); !s.ok()) {
    return ReportError(s);
  }
  std::fprintf(stderr, "%s: %zu tokens from %zu files (vocabulary %d, llm.c version %d)\n",
               o.output.c_str(), stream->tokens.size(), stream->files.size(),
               (*tokenizer)->vocab_size(),
               (*tokenizer)->vocab_size() > 65535 ? kLlmcVersionUint32 : kLlmcVersion);
  return kExitOk;
}

}  // namespace

void RegisterTokenizeCommand(CLI::App& app, CommandResult& result) {
  auto o = std::make_shared<TokenizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Tokenize text files or folders with a Hugging Face tokenizer into a .bin");
  cmd->add_option("--tokenizer", o->tokenizer, "a folder holding tokenizer.json")->required();
  cmd->add_option("inputs", o->inputs, "text files or folders of them (read in the given order)")
      ->required();
  cmd->add_option("-o,--output", o->output, "the llm.c token file to write")->required();
  cmd->add_option("--threads", o->threads, "tokenizing threads (0: all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("-q,--quiet", o->quiet, "no progress bar");
  cmd->callback([o, &result] { result.run = [o] { return RunTokenize(*o); }; });
}

}  // namespace meshrun::client
