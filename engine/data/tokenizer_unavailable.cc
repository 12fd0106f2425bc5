// Tokenizers in a build without nlohmann-json or PCRE2 (engine-only): refused at run time.
#include "engine/data/instruction.h"
#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"

namespace meshrun {
namespace {
Status Unavailable() {
  return UnimplementedError(
      "data.tokenizer: this build has no tokenizer support (hint: install nlohmann-json and "
      "libpcre2-dev, e.g. with scripts/setup, and rebuild)");
}
}  // namespace

Tokenizer::~Tokenizer() = default;

StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::Load(const std::string&) {
  return Unavailable();
}

StatusOr<TokenStream> TokenizeTexts(const std::vector<std::string>&,
                                    std::shared_ptr<const Tokenizer>, const LoadOptions&) {
  return Unavailable();
}

Status WriteLlmcTokens(const std::string&, const std::vector<int32_t>&, int32_t) {
  return Unavailable();
}

StatusOr<TokenStream> LoadInstructionData(const std::string&, const LoadOptions&) {
  return Unavailable();
}

}  // namespace meshrun
