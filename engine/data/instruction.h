// Instruction data (docs/data.md "Instruction data"): JSONL records with `text`, `prompt` and
// `completion`, or chat `messages`, rendered by a chat template into token ids with one flag byte
// per token (loss target, sample start, padding), and laid out in training windows (one sample
// per window, or packed). Also the loss mask the trainer applies to a window's targets.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/data/token_stream.h"

namespace meshrun {

class Tokenizer;

// The flag byte of a token (in memory, and in the `.mask` files beside token files).
inline constexpr uint8_t kTokenTarget = 1;    // a completion / assistant token (any `text` token)
inline constexpr uint8_t kTokenDocStart = 2;  // the first token of a sample
inline constexpr uint8_t kTokenPad = 4;       // padding after a sample: never a target
// A target the loss ignores (transformers' ignore_index): no loss, no gradient, not counted.
inline constexpr int32_t kIgnoreTarget = -100;

// Whether a token with `flags` is a loss target under `loss_on`: never padding nor a sample's
// first token (nothing predicts the next sample); with kCompletion only kTokenTarget tokens.
inline bool IsLossTarget(uint8_t flags, LossOn loss_on) {
  if (flags & (kTokenPad | kTokenDocStart)) return false;
  return loss_on == LossOn::kAll || (flags & kTokenTarget) != 0;
}

// How records are rendered (data.template).
enum class TemplateFamily {
  kChatml,   // <|im_start|>role\n…<|im_end|>\n (Qwen2), with its default system turn
  kLlama2,   // <s>[INST] <<SYS>>\n…\n<</SYS>>\n\n… [/INST] … </s>
  kMistral,  // <s>[INST] … [/INST]…</s> (Mistral 7B v0.1)
  kLlama3,   // <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n…<|eot_id|>
  kCustom,   // the spec's own: a string with {prompt} and {completion}
};
const char* TemplateFamilyName(TemplateFamily family);

struct ChatTemplate {
  TemplateFamily family = TemplateFamily::kChatml;
  std::string bos;             // bos_token's text (llama2, mistral, llama3)
  std::string eos;             // eos_token's text (llama2, mistral)
  std::string default_system;  // chatml: the system turn added when the first message is no system
  std::string before_completion;  // custom: the text before {completion} (with {prompt} in it)
  std::string after_completion;   // custom: the text after {completion}
  bool from_tokenizer = false;    // recognised in tokenizer_config.json (else named in the spec)
};

// Resolves data.template: "" or "tokenizer" (the chat_template of DIR/tokenizer_config.json,
// recognised as one of the families; INVALID_ARGUMENT naming the fix otherwise), "chatml",
// "llama2", "mistral", "llama3", or a custom template holding `{prompt}` then `{completion}`
// once each. bos/eos come from tokenizer_config.json (or the family's usual tokens).
StatusOr<ChatTemplate> ResolveChatTemplate(const std::string& spec_template,
                                           const std::string& tokenizer_dir);
// The same from tokenizer_config.json's text (`origin` names it in errors; "" when none).
StatusOr<ChatTemplate> ChatTemplateFromConfig(const std::string& spec_template,
                                              const std::string& config_json,
                                              const std::string& origin);

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// One rendered piece of a sample and whether its tokens are targets.
struct TextPart {
  std::string text;
  bool target = false;
};

// The parts of a conversation rendered with `tmpl` (INVALID_ARGUMENT for roles the family
// refuses, e.g. a system message under mistral, or turns that do not alternate).
StatusOr<std::vector<TextPart>> RenderChat(const std::vector<ChatMessage>& messages,
                                           const ChatTemplate& tmpl);

// One JSONL line as parts: {"text"} is one target part (no template); {"prompt","completion"}
// is a user and an assistant message; {"messages": [{role, content}, …]} a conversation.
// `tmpl` may be null when no template is available (then only `text` records are accepted).
// Errors name `where` (FILE:LINE). A record with an empty `text` gives no parts.
StatusOr<std::vector<TextPart>> RecordParts(std::string_view line, const ChatTemplate* tmpl,
                                            const std::string& where);

// A sample's ids and flags: the parts' text encoded whole (so the ids are those of the rendered
// text), each token flagged kTokenTarget when it starts inside a target part (a token that
// spans a part boundary belongs to the earlier part), the first token kTokenDocStart, and the
// end-of-text token appended unless the ids end with it (a target when any token is).
Status EncodeSample(const Tokenizer& tokenizer, const std::vector<TextPart>& parts,
                    std::vector<int32_t>* ids, std::vector<uint8_t>* flags);

// Lays samples out in windows of seq_len (window j = tokens [j·T, j·T + T + 1), as the sampler
// reads a stream): a sample starts a new window unless `pack` and it fits in what is left of the
// current one; one longer than a window runs on over the next windows. The rest of a window is
// padding: `pad_id` flagged kTokenPad. One more pad ends the stream (the last window's last
// target).
class WindowPacker {
 public:
  WindowPacker(int seq_len, bool pack, int32_t pad_id)
      : seq_len_(seq_len), pack_(pack), pad_id_(pad_id) {}
  void Add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& flags);
  // Pads the last window; the stream is then complete.
  void Finish();
  std::vector<int32_t>& tokens() { return tokens_; }
  std::vector<uint8_t>& flags() { return flags_; }
  int64_t samples() const { return samples_; }

 private:
  void PadToWindow();
  int seq_len_;
  bool pack_;
  int32_t pad_id_;
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> flags_;
  int64_t samples_ = 0;
};

// Reads JSONL records of instruction data (`path`, one file) with `tokenizer` and `tmpl` into a
// stream laid out by WindowPacker (format "jsonl", flags set, window_seq_len = seq_len).
StatusOr<TokenStream> LoadInstructionJsonl(const std::string& path,
                                           std::shared_ptr<const Tokenizer> tokenizer,
                                           const ChatTemplate* tmpl, int seq_len, bool pack);

// Writes flags as a mask file (engine/data/mapped_tokens.h: the header, then the bytes),
// atomically.
Status WriteMaskFile(const std::string& path, const std::vector<uint8_t>& flags, int seq_len);

// data.train as LoadTokens reads a `.jsonl` file: LoadInstructionJsonl with options.tokenizer
// (required), options.chat_template, seq_len and pack. Errors name the file and line.
StatusOr<TokenStream> LoadInstructionData(const std::string& path, const LoadOptions& options);

// True for a file name ending in .jsonl (any case).
bool IsJsonlPath(const std::string& path);

// Sets targets[t] to kIgnoreTarget where the token it names (stream tokens [first, first +
// count)) is no loss target; returns how many are. A stream without flags: every token is one.
StatusOr<int64_t> MaskTargets(const TokenStream& stream, int64_t first, int count, LossOn loss_on,
                              int32_t* targets);
// How many of stream tokens [first, first + count) are loss targets.
StatusOr<int64_t> CountTargets(const TokenStream& stream, int64_t first, int count, LossOn loss_on);

// train.loss_on completion needs a stream with flags (INVALID_ARGUMENT naming `field` and the
// fix otherwise); a stream laid out in windows needs model.seq_len to be its window.
Status CheckStreamLossMask(const TokenStream& stream, const JobSpec& spec,
                           const std::string& field);

}  // namespace meshrun
