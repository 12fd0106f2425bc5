// Instruction data: chat templates recognised without a Jinja engine, records rendered into
// parts, parts encoded into ids with flags, and samples laid out in windows (docs/data.md
// "Instruction data").
#include "engine/data/instruction.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>

#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"

namespace meshrun {
namespace {

using json = nlohmann::json;

constexpr const char* kTemplateHint =
    "set data.template to chatml, llama2, mistral or llama3 when the model was trained with one "
    "of them, or spell a template out, e.g. data.template: \"### Question:\\n{prompt}\\n### "
    "Answer:\\n{completion}\"";

Status TemplateError(const std::string& what) {
  return InvalidArgumentError("data.template: " + what + " (hint: " + kTemplateHint + ")");
}

// A special token's text in tokenizer_config.json: a string or {"content": …}.
std::string TokenText(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

bool TemplateHas(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

// Jinja's `trim` and Python's str.strip() on ASCII whitespace.
std::string StripAsciiSpace(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

// ChatML's default system turn: the literal after `<|im_start|>system\n` (a Jinja string, so
// `\n` is written as a backslash and an n) up to `<|im_end|>`, when it holds no quote or
// expression (the template's own system turn is `… + message['content'] + …`).
std::string ChatmlDefaultSystem(const std::string& tmpl) {
  for (const char* head_text : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    const std::string head = head_text;
    size_t at = 0;
    while ((at = tmpl.find(head, at)) != std::string::npos) {
      at += head.size();
      const size_t end = tmpl.find("<|im_end|>", at);
      if (end == std::string::npos) break;
      const std::string body = tmpl.substr(at, end - at);
      if (body.find_first_of("'\"{}+") != std::string::npos) continue;
      std::string out;
      for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] == '\\' && i + 1 < body.size()) {
          const char c = body[++i];
          out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
        } else {
          out += body[i];
        }
      }
      return out;
    }
  }
  return "";
}

// The family a tokenizer_config.json chat_template renders as, or an error naming why not.
Status RecogniseTemplate(const std::string& tmpl, const std::string& origin, ChatTemplate* out) {
  if (TemplateHas(tmpl, "<|im_start|>") && TemplateHas(tmpl, "<|im_end|>")) {
    if (TemplateHas(tmpl, "tool")) {
      return TemplateError("the chat_template of " + origin +
                           " is ChatML with tool calls, which meshrun does not render without "
                           "a Jinja engine");
    }
    out->family = TemplateFamily::kChatml;
    if (TemplateHas(tmpl, "!= 'system'") || TemplateHas(tmpl, "!= \"system\"")) {
      out->default_system = ChatmlDefaultSystem(tmpl);
    }
    return OkStatus();
  }
  if (TemplateHas(tmpl, "<|start_header_id|>") && TemplateHas(tmpl, "<|eot_id|>")) {
    if (TemplateHas(tmpl, "Cutting Knowledge Date") || TemplateHas(tmpl, "tool")) {
      return TemplateError("the chat_template of " + origin +
                           " is Llama 3.1's or later (a dated system turn, tool calls), which "
                           "meshrun does not render without a Jinja engine");
    }
    out->family = TemplateFamily::kLlama3;
    return OkStatus();
  }
  if (TemplateHas(tmpl, "[INST]") && TemplateHas(tmpl, "[/INST]")) {
    out->family = TemplateHas(tmpl, "<<SYS>>") ? TemplateFamily::kLlama2 : TemplateFamily::kMistral;
    return OkStatus();
  }
  return TemplateError("the chat_template of " + origin +
                       " is none of the families meshrun renders without a Jinja engine "
                       "(ChatML, Llama 2 / Mistral [INST], Llama 3 headers)");
}

void AddPart(std::vector<TextPart>* parts, std::string text, bool target) {
  if (text.empty()) return;
  if (!parts->empty() && parts->back().target == target) {
    parts->back().text += text;
  } else {
    parts->push_back({std::move(text), target});
  }
}

// Turns that must alternate user, assistant, user, … (llama2, mistral, custom).
Status CheckAlternating(const std::vector<ChatMessage>& turns, const char* family) {
  for (size_t i = 0; i < turns.size(); ++i) {
    const char* want = i % 2 == 0 ? "user" : "assistant";
    if (turns[i].role != want) {
      return InvalidArgumentError(std::string("message ") + std::to_string(i) + " has role '" +
                                  turns[i].role + "' where the " + family + " template expects '" +
                                  want +
                                  "' (hint: conversations alternate user and assistant turns, "
                                  "starting with user)");
    }
  }
  return OkStatus();
}

}  // namespace

const char* TemplateFamilyName(TemplateFamily family) {
  switch (family) {
    case TemplateFamily::kChatml: return "chatml";
    case TemplateFamily::kLlama2: return "llama2";
    case TemplateFamily::kMistral: return "mistral";
    case TemplateFamily::kLlama3: return "llama3";
    case TemplateFamily::kCustom: return "custom";
  }
  return "custom";
}

StatusOr<ChatTemplate> ChatTemplateFromConfig(const std::string& spec_template,
                                              const std::string& config_json,
                                              const std::string& origin) {
  json config = config_json.empty() ? json::object() : json::parse(config_json, nullptr, false);
  if (config.is_discarded()) config = json::object();
  ChatTemplate t;
  t.bos = TokenText(config, "bos_token");
  t.eos = TokenText(config, "eos_token");
  if (spec_template.empty() || spec_template == "tokenizer") {
    if (origin.empty()) {
      return TemplateError(
          "chat records need a chat template, and data.tokenizer names no "
          "tokenizer_config.json");
    }
    std::string tmpl;
    if (config.contains("chat_template")) {
      const json& c = config["chat_template"];
      if (c.is_string()) tmpl = c.get<std::string>();
      if (c.is_array()) {  // [{name, template}, …]: the one named "default"
        for (const json& e : c) {
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
              e["template"].is_string()) {
            tmpl = e["template"].get<std::string>();
          }
        }
      }
    }
    if (tmpl.empty()) return TemplateError(origin + " has no chat_template");
    MESHRUN_RETURN_IF_ERROR(RecogniseTemplate(tmpl, origin, &t));
    t.from_tokenizer = true;
  } else if (spec_template == "chatml") {
    t.family = TemplateFamily::kChatml;
  } else if (spec_template == "llama2") {
    t.family = TemplateFamily::kLlama2;
  } else if (spec_template == "mistral") {
    t.family = TemplateFamily::kMistral;
  } else if (spec_template == "llama3") {
    t.family = TemplateFamily::kLlama3;
  } else {
    const size_t p = spec_template.find("{prompt}");
    const size_t c = spec_template.find("{completion}");
    if (p == std::string::npos || c == std::string::npos || c < p ||
        spec_template.find("{prompt}", p + 1) != std::string::npos ||
        spec_template.find("{completion}", c + 1) != std::string::npos) {
      return TemplateError("'" + spec_template.substr(0, 80) +
                           "' is neither a family (tokenizer, chatml, llama2, mistral, llama3) "
                           "nor a template with {prompt} followed by {completion}, once each");
    }
    t.family = TemplateFamily::kCustom;
    t.before_completion = spec_template.substr(0, c);
    t.after_completion = spec_template.substr(c + std::string("{completion}").size());
  }
  // The families' usual tokens when tokenizer_config.json does not name them.
  if (t.family == TemplateFamily::kLlama2 || t.family == TemplateFamily::kMistral) {
    if (t.bos.empty()) t.bos = "<s>";
    if (t.eos.empty()) t.eos = "</s>";
  }
  if (t.family == TemplateFamily::kLlama3 && t.bos.empty()) t.bos = "<|begin_of_text|>";
  return t;
}

StatusOr<ChatTemplate> ResolveChatTemplate(const std::string& spec_template,
                                           const std::string& tokenizer_dir) {
  std::string config;
  std::string origin;
  if (!tokenizer_dir.empty()) {
    origin = tokenizer_dir + "/tokenizer_config.json";
    if (!ReadTextFile(origin, &config).ok()) {
      config.clear();
      origin.clear();
    }
  }
  return ChatTemplateFromConfig(spec_template, config, origin);
}

StatusOr<std::vector<TextPart>> RenderChat(const std::vector<ChatMessage>& messages,
                                           const ChatTemplate& t) {
  std::vector<TextPart> parts;
  switch (t.family) {
    case TemplateFamily::kChatml: {
      if (!t.default_system.empty() && (messages.empty() || messages[0].role != "system")) {
        AddPart(&parts, "<|im_start|>system\n" + t.default_system + "<|im_end|>\n", false);
      }
      for (const ChatMessage& m : messages) {
        if (m.role == "assistant") {
          AddPart(&parts, "<|im_start|>assistant\n", false);
          AddPart(&parts, m.content + "<|im_end|>", true);
          AddPart(&parts, "\n", false);
        } else {
          AddPart(&parts, "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n", false);
        }
      }
      return parts;
    }
    case TemplateFamily::kLlama3: {
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        std::string head = "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        if (i == 0) head = t.bos + head;
        const bool target = m.role == "assistant";
        AddPart(&parts, head, false);
        AddPart(&parts, StripAsciiSpace(m.content) + "<|eot_id|>", target);
      }
      return parts;
    }
    case TemplateFamily::kLlama2: {
      std::vector<ChatMessage> turns = messages;
      std::string system;
      if (!turns.empty() && turns[0].role == "system") {
        system = turns[0].content;
        turns.erase(turns.begin());
      }
      MESHRUN_RETURN_IF_ERROR(CheckAlternating(turns, "llama2"));
      for (size_t i = 0; i < turns.size(); ++i) {
        std::string content = turns[i].content;
        if (i == 0 && !system.empty()) {
          content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
        }
        if (turns[i].role == "user") {
          AddPart(&parts, t.bos + "[INST] " + StripAsciiSpace(content) + " [/INST]", false);
        } else {
          AddPart(&parts, " " + StripAsciiSpace(content) + " " + t.eos, true);
        }
      }
      return parts;
    }
    case TemplateFamily::kMistral: {
      MESHRUN_RETURN_IF_ERROR(CheckAlternating(messages, "mistral"));
      AddPart(&parts, t.bos, false);
      for (const ChatMessage& m : messages) {
        if (m.role == "user") {
          AddPart(&parts, "[INST] " + m.content + " [/INST]", false);
        } else {
          AddPart(&parts, m.content + t.eos, true);
        }
      }
      return parts;
    }
    case TemplateFamily::kCustom: {
      MESHRUN_RETURN_IF_ERROR(CheckAlternating(messages, "data.template"));
      for (size_t i = 0; i < messages.size(); i += 2) {
        std::string before = t.before_completion;
        before.replace(before.find("{prompt}"), 8, messages[i].content);
        AddPart(&parts, before, false);
        if (i + 1 < messages.size()) {
          AddPart(&parts, messages[i + 1].content + t.after_completion, true);
        }
      }
      return parts;
    }
  }
  return parts;
}

StatusOr<std::vector<TextPart>> RecordParts(std::string_view line, const ChatTemplate* tmpl,
                                            const std::string& where) {
  json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(where +
                                ": not a JSON object (hint: give one JSON object per line, UTF-8)");
  }
  auto string_field = [&](const char* key, std::string* out) -> Status {
    const json& v = j[key];
    if (!v.is_string()) {
      return InvalidArgumentError(where + ": \"" + key + "\" is " + v.type_name() +
                                  ", not a string (hint: give text)");
    }
    *out = v.get<std::string>();
    return OkStatus();
  };
  std::vector<ChatMessage> messages;
  if (j.contains("messages")) {
    const json& ms = j["messages"];
    if (!ms.is_array()) {
      return InvalidArgumentError(where + ": \"messages\" is " + std::string(ms.type_name()) +
                                  ", not a list (hint: \"messages\": [{\"role\": \"user\", "
                                  "\"content\": \"…\"}, …])");
    }
    for (size_t i = 0; i < ms.size(); ++i) {
      const json& m = ms[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !m.contains("content") || !m["content"].is_string()) {
        return InvalidArgumentError(where + ": message " + std::to_string(i) +
                                    " is not {\"role\": string, \"content\": string} (hint: "
                                    "give each message a role and a text content)");
      }
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant") {
        return InvalidArgumentError(where + ": message " + std::to_string(i) + " has role '" +
                                    role.substr(0, 40) +
                                    "' (hint: roles are system, user and assistant)");
      }
      messages.push_back({role, m["content"].get<std::string>()});
    }
  } else if (j.contains("prompt") || j.contains("completion")) {
    std::string prompt, completion;
    if (!j.contains("prompt") || !j.contains("completion")) {
      return InvalidArgumentError(
          where + ": the record has \"" + (j.contains("prompt") ? "prompt" : "completion") +
          "\" without \"" + (j.contains("prompt") ? "completion" : "prompt") +
          "\" (hint: give both, or the whole text as \"text\")");
    }
    MESHRUN_RETURN_IF_ERROR(string_field("prompt", &prompt));
    MESHRUN_RETURN_IF_ERROR(string_field("completion", &completion));
    messages = {{"user", prompt}, {"assistant", completion}};
  } else if (j.contains("text")) {
    std::string text;
    MESHRUN_RETURN_IF_ERROR(string_field("text", &text));
    if (text.empty()) return std::vector<TextPart>{};
    return std::vector<TextPart>{{text, true}};
  } else {
    return InvalidArgumentError(where +
                                ": the record has none of \"text\", \"prompt\"/\"completion\", "
                                "\"messages\" (hint: give one of them)");
  }
  if (tmpl == nullptr) {
    return InvalidArgumentError(where +
                                ": a chat record, but no chat template (hint: set "
                                "data.template, or use a tokenizer with a chat_template)");
  }
  StatusOr<std::vector<TextPart>> parts = RenderChat(messages, *tmpl);
  if (!parts.ok()) return InvalidArgumentError(where + ": " + parts.status().message());
  return parts;
}

Status EncodeSample(const Tokenizer& tokenizer, const std::vector<TextPart>& parts,
                    std::vector<int32_t>* ids, std::vector<uint8_t>* flags) {
  ids->clear();
  flags->clear();
  std::string whole;
  for (const TextPart& p : parts) whole += p.text;
  if (whole.empty()) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(*ids, tokenizer.Encode(whole));
  flags->assign(ids->size(), 0);
  // Where each part's tokens begin: the ids of the text before it, compared with the whole's
  // (equal when no token spans the boundary; else the spanning token is the earlier part's).
  size_t offset = 0, begin = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    size_t end = ids->size();
    offset += parts[k].text.size();
    if (k + 1 < parts.size()) {
      MESHRUN_ASSIGN_OR_RETURN(std::vector<int32_t> prefix,
                               tokenizer.Encode(std::string_view(whole).substr(0, offset)));
      size_t common = 0;
      while (common < prefix.size() && common < ids->size() && prefix[common] == (*ids)[common]) {
        ++common;
      }
      end = common == prefix.size() ? common : std::min(common + 1, ids->size());
      end = std::max(end, begin);
    }
    if (parts[k].target) {
      for (size_t i = begin; i < end; ++i) (*flags)[i] |= kTokenTarget;
    }
    begin = end;
  }
  const int32_t eot = tokenizer.end_of_text_id();
  const bool any_target =
      std::any_of(flags->begin(), flags->end(), [](uint8_t f) { return f & kTokenTarget; });
  if (eot >= 0 && (ids->empty() || ids->back() != eot)) {
    ids->push_back(eot);
    flags->push_back(any_target ? kTokenTarget : 0);
  }
  if (!ids->empty()) (*flags)[0] |= kTokenDocStart;
  return OkStatus();
}

void WindowPacker::PadToWindow() {
  while (tokens_.size() % static_cast<size_t>(seq_len_) != 0) {
    tokens_.push_back(pad_id_);
    flags_.push_back(kTokenPad);
  }
}

void WindowPacker::Add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& flags) {
  if (ids.empty()) return;
  const size_t T = static_cast<size_t>(seq_len_);
  const size_t used = tokens_.size() % T;
  if (used != 0 && (!pack_ || ids.size() > T - used)) PadToWindow();
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  flags_.insert(flags_.end(), flags.begin(), flags.end());
  ++samples_;
}

void WindowPacker::Finish() {
  PadToWindow();
  tokens_.push_back(pad_id_);
  flags_.push_back(kTokenPad);
}

StatusOr<TokenStream> LoadInstructionJsonl(const std::string& path,
                                           std::shared_ptr<const Tokenizer> tokenizer,
                                           const ChatTemplate* tmpl, int seq_len, bool pack) {
  const int32_t eot = tokenizer->end_of_text_id();
  if (eot < 0) {
    return InvalidArgumentError(
        "data.tokenizer: the tokenizer has no end-of-text token to end each sample of " + path +
        " with (hint: set eos_token in tokenizer_config.json)");
  }
  if (seq_len < 1) return InvalidArgumentError("model.seq_len: must be at least 1");
  std::string bytes;
  MESHRUN_RETURN_IF_ERROR(ReadTextFile(path, &bytes));
  WindowPacker packer(seq_len, pack, eot);
  std::vector<int32_t> ids;
  std::vector<uint8_t> flags;
  size_t pos = 0;
  int64_t line = 0;
  while (pos < bytes.size()) {
    size_t end = bytes.find('\n', pos);
    if (end == std::string::npos) end = bytes.size();
    std::string_view rec(bytes.data() + pos, end - pos);
    pos = end + 1;
    ++line;
    if (rec.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = path + ":" + std::to_string(line);
    MESHRUN_ASSIGN_OR_RETURN(std::vector<TextPart> parts, RecordParts(rec, tmpl, where));
    if (Status s = EncodeSample(*tokenizer, parts, &ids, &flags); !s.ok()) {
      return InvalidArgumentError(where + ": " + s.message());
    }
    packer.Add(ids, flags);
  }
  if (packer.samples() == 0) {
    return InvalidArgumentError(path + ": no records (hint: give one JSON object per line)");
  }
  packer.Finish();
  TokenStream s;
  s.path = path;
  s.format = "jsonl";
  s.vocab_size = tokenizer->vocab_size();
  s.tokens = std::move(packer.tokens());
  s.flags = std::move(packer.flags());
  s.max_token_id = s.tokens.empty() ? -1 : *std::max_element(s.tokens.begin(), s.tokens.end());
  s.window_seq_len = seq_len;
  s.files = {path};
  return s;
}

StatusOr<TokenStream> LoadInstructionData(const std::string& path, const LoadOptions& options) {
  if (options.tokenizer.empty()) {
    return InvalidArgumentError(path +
                                ": JSONL records need data.tokenizer (an end-of-text token ends "
                                "each sample) (hint: set data.tokenizer to a Hugging Face "
                                "tokenizer folder)");
  }
  MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> tokenizer,
                           Tokenizer::Load(options.tokenizer));
  // The template is needed only by chat records: its error is theirs.
  StatusOr<ChatTemplate> tmpl = ResolveChatTemplate(options.chat_template, options.tokenizer);
  if (!tmpl.ok() && !options.chat_template.empty() && options.chat_template != "tokenizer") {
    return tmpl.status();  // a template the spec names must be valid
  }
  StatusOr<TokenStream> s = LoadInstructionJsonl(path, tokenizer, tmpl.ok() ? &*tmpl : nullptr,
                                                 options.seq_len, options.pack);
  if (!s.ok() && !tmpl.ok() && s.status().message().find("no chat template") != std::string::npos) {
    return tmpl.status();
  }
  return s;
}

}  // namespace meshrun
