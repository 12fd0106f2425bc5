// `meshrun tokenize --tokenizer DIR INPUT… -o OUT.bin`: text files and folders tokenized with a
// Hugging Face tokenizer into one llm.c token file (docs/data.md "Tokenizers").
#pragma once

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

struct CommandResult;

void RegisterTokenizeCommand(CLI::App& app, CommandResult& result);

}  // namespace meshrun::client
