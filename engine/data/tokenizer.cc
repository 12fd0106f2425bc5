// Byte-level BPE from tokenizer.json (see tokenizer.h). The vocabulary is kept as raw bytes (the
// ByteLevel alphabet undone at load), so encoding never builds the mapped strings.
#include "engine/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/confined_file.h"

namespace meshrun {
namespace {

using json = nlohmann::json;

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100… in byte order. Returns byte → code point.
std::vector<uint32_t> ByteToCodePoint() {
  std::vector<uint32_t> map(256, 0);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? b : next++;
  return map;
}

// Undoes the ByteLevel alphabet: false when `key` holds a character outside it (then the token
// is reachable only as an added token).
bool UnmapByteLevel(const std::string& key, const std::vector<int>& cp_to_byte, std::string* out) {
  out->clear();
  const auto* p = reinterpret_cast<const unsigned char*>(key.data());
  const size_t n = key.size();
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int len;
    if (p[i] < 0x80) {
      cp = p[i], len = 1;
    } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n) {
      cp = ((p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F), len = 2;
    } else {
      return false;  // the alphabet ends at U+0143: 1- and 2-byte characters only
    }
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
    out->push_back(static_cast<char>(cp_to_byte[cp]));
    i += len;
  }
  return true;
}

uint64_t Fnv1a(std::string_view bytes, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

Status ReadFile(const std::string& path, std::string* out) {
  MESHRUN_ASSIGN_OR_RETURN(ConfinedName name, ConfinedName::ForRead(path));
  std::ifstream in(name.name(), std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open for reading: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = std::move(ss).str();
  return OkStatus();
}

bool IsSpace(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

// The work one pcre2_match may do at one start position (PCRE2's match and depth limits; the JIT
// counts its own way but honours the same limit): kMatchLimitBase plus kMatchLimitPerByte for each
// byte left in the piece. A pattern that backtracks only over what it reads (the GPT-2 and Llama 3
// patterns: at most about one step per byte of a whitespace run) stays far below it; a nested
// quantifier such as (a+)+$ needs exponentially many steps and fails in milliseconds instead of
// spinning for minutes. Whole-piece work is bounded by bytes × limit.
constexpr uint64_t kMatchLimitBase = 20000;
constexpr uint64_t kMatchLimitPerByte = 4;
// The JIT's own stack (PCRE2's default is 32 KiB on the machine stack): grown up to this much.
constexpr size_t kJitStackStart = 32 * 1024;
constexpr size_t kJitStackMax = 1024 * 1024;

uint32_t MatchLimitFor(size_t remaining) {
  const uint64_t limit = kMatchLimitBase + kMatchLimitPerByte * static_cast<uint64_t>(remaining);
  return static_cast<uint32_t>(std::min<uint64_t>(limit, UINT32_MAX));
}

// A pattern as an error message shows it: control bytes escaped, at most 80 bytes.
std::string PatternForMessage(const std::string& pattern) {
  std::string out;
  for (unsigned char c : pattern.substr(0, 80)) {
    if (c < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (pattern.size() > 80) out += "...";
  return out;
}

}  // namespace

// A compiled PCRE2 pattern (UTF, Unicode classes, JIT when available). Shared, read-only.
struct Tokenizer::Regex {
  pcre2_code* code = nullptr;
  std::string pattern;  // as tokenizer.json gives it, for error messages
  ~Regex() { pcre2_code_free(code); }
};

// One thread's match state for one pattern: the match data, a match context carrying the limits,
// and the JIT stack it points to (a JIT stack serves one thread at a time).
struct TokenizerEncoder::MatchData {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ~MatchData() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

Tokenizer::~Tokenizer() = default;

StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::Load(const std::string& dir) {
  const std::string file = dir + "/tokenizer.json";
  std::string text, config;
  if (Status s = ReadFile(file, &text); !s.ok()) {
    return InvalidArgumentError(
        "data.tokenizer: " + dir + " has no readable tokenizer.json (" + s.message() +
        ") (hint: point it at a Hugging Face tokenizer folder, e.g. one that "
        "tokenizer.save_pretrained wrote)");
  }
  const std::string config_file = dir + "/tokenizer_config.json";
  if (!ReadFile(config_file, &config).ok()) config.clear();  // optional
  return FromJson(text, config, file);
}

StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::FromJson(const std::string& tokenizer_json,
                                                               const std::string& config_json,
                                                               const std::string& origin) {
  auto bad = [&](const std::string& what, const std::string& hint) {
    return InvalidArgumentError("data.tokenizer: " + origin + ": " + what + " (hint: " + hint +
                                ")");
  };
  const char* kByteLevelHint =
      "meshrun reads byte-level BPE tokenizers (GPT-2, Llama 3 and their kin)";
  json j = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return bad("not valid JSON", "re-save it with tokenizer.save(\"tokenizer.json\")");
  }
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->digest_ = Fnv1a(config_json, Fnv1a(tokenizer_json));
  // SentencePiece-style BPE (Llama 2, Mistral, Gemma): its normalizer and pre-tokenizer are
  // read by SpmParse (sentencepiece_bpe.cc), the rest below.
  MESHRUN_RETURN_IF_ERROR(SpmParse(j, origin, t.get()));
  if (t->spm_) {
    j.erase("normalizer");
    j.erase("pre_tokenizer");
  }

  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    const bool empty_sequence =
        n.value("type", "") == "Sequence" && n.contains("normalizers") && n["normalizers"].empty();
    if (!empty_sequence) {
      return bad("normalizer " + n.value("type", std::string("?")) + " is not supported",
                 kByteLevelHint);
    }
  }

  // Pre-tokenizer steps, a Sequence flattened.
  bool byte_level = false;
  std::vector<json> steps;
  if (j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object()) {
    const json& p = j["pre_tokenizer"];
    if (p.value("type", "") == "Sequence") {
      for (const json& s : p.value("pretokenizers", json::array())) steps.push_back(s);
    } else {
      steps.push_back(p);
    }
  }
  auto compile = [&](const std::string& pattern, bool literal) -> StatusOr<std::shared_ptr<Regex>> {
    int err = 0;
    PCRE2_SIZE at = 0;
    const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     options, &err, &at, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return bad("pre_tokenizer pattern " + pattern + " does not compile at offset " +
                     std::to_string(at) + ": " + reinterpret_cast<char*>(msg),
                 "fix the pattern");
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
    auto r = std::make_shared<Regex>();
    r->code = code;
    r->pattern = pattern;
    return r;
  };
  for (const json& s : steps) {
    const std::string type = s.value("type", "");
    PreStep step{};
    if (type == "ByteLevel") {
      byte_level = true;
      step.kind = PreStep::kByteLevel;
      step.add_prefix_space = s.value("add_prefix_space", true);
      if (s.value("use_regex", true)) {
        MESHRUN_ASSIGN_OR_RETURN(step.regex, compile(kGpt2Pattern, false));
      }
    } else if (type == "Split") {
      step.kind = PreStep::kSplit;
      const json& pat = s.value("pattern", json::object());
      const std::string behavior = s.value("behavior", "");
      if (s.value("invert", false) || (behavior != "Isolated" && behavior != "Removed")) {
        return bad("Split with behavior " + behavior +
                       (s.value("invert", false) ? ", invert" : "") + " is not supported",
                   "use behavior Isolated (Llama 3's) or Removed, invert false");
      }
      step.remove_matches = behavior == "Removed";
      if (pat.contains("Regex")) {
        MESHRUN_ASSIGN_OR_RETURN(step.regex, compile(pat["Regex"].get<std::string>(), false));
      } else if (pat.contains("String")) {
        MESHRUN_ASSIGN_OR_RETURN(step.regex, compile(pat["String"].get<std::string>(), true));
      } else {
        return bad("Split without a Regex or String pattern", "give the pattern");
      }
    } else {
      return bad("pre_tokenizer " + type + " is not supported", kByteLevelHint);
    }
    t->steps_.push_back(std::move(step));
  }
  if (!byte_level && !t->spm_) return bad("no ByteLevel pre-tokenizer", kByteLevelHint);

  const json& m = j.value("model", json::object());
  if (m.value("type", "BPE") != "BPE") {
    return bad("model type " + m.value("type", std::string()) + " is not supported",
               kByteLevelHint);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
    if (m.contains(key) && !m[key].is_null() &&
        !(m[key].is_string() && m[key].get<std::string>().empty())) {
      return bad(std::string("model.") + key + " is not supported", kByteLevelHint);
    }
  }
  t->ignore_merges_ = m.value("ignore_merges", false);
  if (!m.contains("vocab") || !m["vocab"].is_object()) {
    return bad("model.vocab is missing", "re-save the tokenizer");
  }

  // Vocabulary: mapped key → id, and each id's bytes.
  const std::vector<uint32_t> b2c = ByteToCodePoint();
  std::vector<int> c2b(512, -1);
  for (int b = 0; b < 256; ++b) c2b[b2c[b]] = b;
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(m["vocab"].size());
  int32_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > (1ll << 30)) return bad("vocab id " + std::to_string(id), "re-save it");
    vocab.emplace(it.key(), static_cast<int32_t>(id));
    max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
  }
  std::vector<std::pair<std::string, int32_t>> added_list;
  for (const json& a : j.value("added_tokens", json::array())) {
    const int64_t id = a.value("id", int64_t{-1});
    const std::string content = a.value("content", "");
    if (id < 0 || id > (1ll << 30) || content.empty()) {
      return bad("added token " + a.dump() + " has no id or content", "re-save it");
    }
    if (a.value("single_word", false)) {
      return bad("added token " + content + " has single_word: true, which is not supported",
                 "set single_word false");
    }
    t->added_.push_back({content, static_cast<int32_t>(id), a.value("lstrip", false),
                         a.value("rstrip", false), t->spm_ && a.value("normalized", false)});
    max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
  }
  t->vocab_size_ = max_id + 1;
  t->id_bytes_.assign(t->vocab_size_, std::string());
  std::fill(std::begin(t->byte_id_), std::end(t->byte_id_), -1);
  std::string bytes;
  for (const auto& [key, id] : vocab) {
    if (t->spm_) {  // text keys; the decoder's ▁ → space
      t->word_ids_.emplace(key, id);
      std::string& d = t->id_bytes_[id];
      for (size_t k = 0; k < key.size();) {
        if (!t->meta_replacement_.empty() &&
            key.compare(k, t->meta_replacement_.size(), t->meta_replacement_) == 0) {
          d += ' ';
          k += t->meta_replacement_.size();
        } else {
          d += key[k++];
        }
      }
    } else if (UnmapByteLevel(key, c2b, &bytes)) {
      t->id_bytes_[id] = bytes;
      if (bytes.size() == 1) t->byte_id_[static_cast<unsigned char>(bytes[0])] = id;
      if (t->ignore_merges_) t->word_ids_.emplace(bytes, id);
    } else {
      t->id_bytes_[id] = key;
    }
  }
  for (const AddedToken& a : t->added_) t->id_bytes_[a.id] = a.content;
  if (t->spm_) {
    t->fallback_byte_.assign(t->vocab_size_, -1);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = vocab.find(name);
      t->fallback_id_[b] = it == vocab.end() ? -1 : it->second;
      if (it != vocab.end() && t->byte_fallback_) {
        t->fallback_byte_[it->second] = static_cast<int16_t>(b);
      }
    }
    // Added tokens with normalized: true are matched in the normalized text, as their
    // normalized content.
    std::vector<AddedToken> kept;
    for (AddedToken& a : t->added_) {
      if (!a.normalized) {
        kept.push_back(a);
        continue;
      }
      for (const NormStep& n : t->normalizer_) {
        if (!n.prepend.empty()) {
          a.content = n.prepend + a.content;
        } else {
          for (size_t at = 0; (at = a.content.find(n.from, at)) != std::string::npos;) {
            a.content.replace(at, n.from.size(), n.to);
            at += n.to.size();
          }
        }
      }
      t->normalized_added_.push_back(a);
    }
    t->added_ = std::move(kept);
    std::stable_sort(
        t->normalized_added_.begin(), t->normalized_added_.end(),
        [](const auto& a, const auto& b) { return a.content.size() > b.content.size(); });
    for (const AddedToken& a : t->normalized_added_) {
      t->norm_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
    }
  }
  std::stable_sort(t->added_.begin(), t->added_.end(), [](const auto& a, const auto& b) {
    return a.content.size() > b.content.size();
  });
  for (const AddedToken& a : t->added_) {
    t->added_first_byte_[static_cast<unsigned char>(a.content[0])] = true;
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = vocab.find(m["unk_token"].get<std::string>());
    if (it != vocab.end()) t->unk_id_ = it->second;
  }

  // Merges by rank: "a b" strings (older files) or [a, b] pairs.
  const json& merges = m.value("merges", json::array());
  t->merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& mg = merges[rank];
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) return bad("merge '" + s + "' has no space", "re-save it");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2) {
      a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
    } else {
      return bad("merge " + mg.dump() + " is neither \"a b\" nor [a, b]", "re-save it");
    }
    auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || ic == vocab.end()) {
      return bad("merge " + mg.dump() + " names a token that is not in model.vocab", "re-save it");
    }
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | uint32_t(ib->second);
    t->merges_.emplace(key, Merge{static_cast<int32_t>(rank), ic->second});  // first rank wins
  }

  // The end-of-text token.
  std::string eos;
  if (!config_json.empty()) {
    json c = json::parse(config_json, nullptr, false);
    if (c.is_object() && c.contains("eos_token")) {
      const json& e = c["eos_token"];
      if (e.is_string()) eos = e.get<std::string>();
      if (e.is_object()) eos = e.value("content", "");
    }
  }
  auto id_of = [&](const std::string& content) -> int32_t {
    for (const AddedToken& a : t->added_) {
      if (a.content == content) return a.id;
    }
    for (const AddedToken& a : t->normalized_added_) {
      if (t->id_bytes_[a.id] == content) return a.id;
    }
    return -1;
  };
  if (!eos.empty()) t->end_of_text_id_ = id_of(eos);
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    if (t->end_of_text_id_ < 0) t->end_of_text_id_ = id_of(name);
  }
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  TokenizerEncoder encoder(this);
  std::vector<int32_t> ids;
  MESHRUN_RETURN_IF_ERROR(encoder.Encode(text, &ids));
  return ids;
}

std::string Tokenizer::DecodeOne(int32_t id) const {
  if (id < 0 || id >= vocab_size_) return std::string();
  return id_bytes_[id];
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  if (spm_) return SpmDecode(ids);
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size_) out += id_bytes_[id];
  }
  return out;
}

TokenizerEncoder::TokenizerEncoder(const Tokenizer* tokenizer) : tok_(tokenizer) {
  for (const Tokenizer::PreStep& s : tok_->steps_) {
    auto md = std::make_unique<MatchData>();
    if (s.regex) {
      md->data = pcre2_match_data_create_from_pattern(s.regex->code, nullptr);
      md->context = pcre2_match_context_create(nullptr);
      md->jit_stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
      // Without a stack of its own (allocation failed) the JIT uses its 32 KiB default.
      if (md->context != nullptr && md->jit_stack != nullptr) {
        pcre2_jit_stack_assign(md->context, nullptr, md->jit_stack);
      }
    }
    match_.push_back(std::move(md));
  }
}

TokenizerEncoder::~TokenizerEncoder() = default;

Status TokenizerEncoder::Encode(std::string_view text, std::vector<int32_t>* out) {
  if (tok_->spm_) return SpmEncode(text, out);
  // Added tokens first: at each position the longest one that matches (leftmost-longest).
  size_t seg = 0, i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (!tok_->added_first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const Tokenizer::AddedToken* hit = nullptr;
    for (const Tokenizer::AddedToken& a : tok_->added_) {
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t seg_end = i;
    if (hit->lstrip) {
      while (seg_end > seg && IsSpace(text[seg_end - 1])) --seg_end;
    }
    MESHRUN_RETURN_IF_ERROR(EncodeSegment(text.substr(seg, seg_end - seg), out));
    out->push_back(hit->id);
    i += hit->content.size();
    if (hit->rstrip) {
      while (i < n && IsSpace(text[i])) ++i;
    }
    seg = i;
  }
  return EncodeSegment(text.substr(seg), out);
}

Status TokenizerEncoder::EncodeSegment(std::string_view segment, std::vector<int32_t>* out) {
  if (segment.empty()) return OkStatus();
  MESHRUN_RETURN_IF_ERROR(PreTokenize(segment));
  for (std::string_view word : pieces_) EncodeWord(word, out);
  owned_.clear();
  return OkStatus();
}

Status TokenizerEncoder::PreTokenize(std::string_view segment) {
  pieces_.assign(1, segment);
  for (size_t k = 0; k < tok_->steps_.size(); ++k) {
    const Tokenizer::PreStep& step = tok_->steps_[k];
    if (step.add_prefix_space) {
      for (std::string_view& p : pieces_) {
        if (!p.empty() && p[0] != ' ') {
          owned_.push_back(" " + std::string(p));
          p = owned_.back();
        }
      }
    }
    if (!step.regex) continue;
    next_pieces_.clear();
    pcre2_match_data* md = match_[k]->data;
    pcre2_match_context* context = match_[k]->context;
    for (std::string_view p : pieces_) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(p.data());
      size_t at = 0, gap = 0;
      uint32_t options = 0;  // the first call checks the piece is UTF-8; later ones need not
      while (at < p.size()) {
        const uint32_t limit = MatchLimitFor(p.size() - at);
        if (context != nullptr) {  // null only when allocating it failed: PCRE2's defaults
          pcre2_set_match_limit(context, limit);
          pcre2_set_depth_limit(context, limit);
        }
        const int rc = pcre2_match(step.regex->code, subject, p.size(), at, options, md, context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
            return InvalidArgumentError("the text is not UTF-8 (byte " +
                                        std::to_string(pcre2_get_startchar(md)) +
                                        " of a piece) (hint: tokenize UTF-8 text)");
          }
          if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
              rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            const char* which = rc == PCRE2_ERROR_MATCHLIMIT   ? "match limit"
                                : rc == PCRE2_ERROR_DEPTHLIMIT ? "depth limit"
                                : rc == PCRE2_ERROR_HEAPLIMIT  ? "heap limit"
                                                               : "JIT stack limit";
            return InvalidArgumentError(
                "data.tokenizer: the pre-tokenizer pattern '" +
                PatternForMessage(step.regex->pattern) + "' exceeded the " + which + " (" +
                std::to_string(limit) + " steps at one position, from byte " + std::to_string(at) +
                " of a " + std::to_string(p.size()) +
                "-byte piece) (hint: the pattern backtracks catastrophically, e.g. a nested "
                "quantifier such "
                "as (a+)+ or (\\w+\\s?)*; rewrite it without nested repeats, or use the pattern "
                "the tokenizer was published with)");
          }
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof(msg));
          return InternalError(std::string("pre-tokenizer regex: ") + reinterpret_cast<char*>(msg));
        }
        options = PCRE2_NO_UTF_CHECK;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e == s) {  // an empty match: step one character on (a UTF-8 lead byte onwards)
          at = s + 1;
          while (at < p.size() && (static_cast<unsigned char>(p[at]) & 0xC0) == 0x80) ++at;
          continue;
        }
        if (s > gap) next_pieces_.push_back(p.substr(gap, s - gap));
        if (!step.remove_matches) next_pieces_.push_back(p.substr(s, e - s));
        gap = at = e;
      }
      if (gap < p.size()) next_pieces_.push_back(p.substr(gap));
    }
    pieces_.swap(next_pieces_);
  }
  return OkStatus();
}

void TokenizerEncoder::EncodeWord(std::string_view word, std::vector<int32_t>* out) {
  if (word.size() == 1) {
    const int32_t id = tok_->byte_id_[static_cast<unsigned char>(word[0])];
    if (id >= 0) {
      out->push_back(id);
    } else if (tok_->unk_id_ >= 0) {
      out->push_back(tok_->unk_id_);
    }
    return;
  }
  std::string key(word);
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    out->insert(out->end(), cache_ids_.begin() + it->second.first,
                cache_ids_.begin() + it->second.first + it->second.second);
    return;
  }
  const size_t before = out->size();
  auto known = tok_->ignore_merges_ ? tok_->word_ids_.find(key) : tok_->word_ids_.end();
  if (known != tok_->word_ids_.end()) {
    out->push_back(known->second);
  } else {
    MergeWord(word, out);
  }
  if (cache_.size() >= (1u << 20)) {  // bound the memory on a corpus of endless distinct words
    cache_.clear();
    cache_ids_.clear();
  }
  cache_.emplace(std::move(key), std::make_pair(static_cast<uint32_t>(cache_ids_.size()),
                                                static_cast<uint32_t>(out->size() - before)));
  cache_ids_.insert(cache_ids_.end(), out->begin() + before, out->end());
}

// Merges by rank: a doubly linked list of symbols and a min-heap of (rank, position) candidate
// pairs, checked when popped (the `tokenizers` order: lowest rank first, then leftmost).
void TokenizerEncoder::MergeWord(std::string_view word, std::vector<int32_t>* out) {
  sym_id_.clear();
  for (unsigned char c : word) {
    const int32_t id = tok_->byte_id_[c];
    if (id >= 0) {
      sym_id_.push_back(id);
    } else if (tok_->unk_id_ >= 0) {
      sym_id_.push_back(tok_->unk_id_);
    }
  }
  RunMerges(out);
}

void TokenizerEncoder::RunMerges(std::vector<int32_t>* out) {
  const int32_t n = static_cast<int32_t>(sym_id_.size());
  if (n == 0) return;
  sym_prev_.resize(n);
  sym_next_.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    sym_prev_[i] = i - 1;
    sym_next_[i] = i + 1 < n ? i + 1 : -1;
  }
  heap_.clear();
  auto push = [&](int32_t pos) {
    const int32_t next = sym_next_[pos];
    if (pos < 0 || next < 0) return;
    const uint64_t key = (static_cast<uint64_t>(sym_id_[pos]) << 32) | uint32_t(sym_id_[next]);
    auto it = tok_->merges_.find(key);
    if (it == tok_->merges_.end()) return;
    heap_.push_back({it->second.rank, pos, sym_id_[pos], sym_id_[next], it->second.id});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    const Candidate c = heap_.back();
    heap_.pop_back();
    const int32_t next = sym_next_[c.pos];
    if (sym_id_[c.pos] != c.left || next < 0 || sym_id_[next] != c.right) continue;  // stale
    sym_id_[c.pos] = c.merged;
    sym_id_[next] = -1;
    sym_next_[c.pos] = sym_next_[next];
    if (sym_next_[c.pos] >= 0) sym_prev_[sym_next_[c.pos]] = c.pos;
    if (sym_prev_[c.pos] >= 0) push(sym_prev_[c.pos]);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym_next_[i]) out->push_back(sym_id_[i]);
}

// The patterns SafeCut knows: in each, no alternative matches a '\n' followed by a non-space
// (so a piece boundary always lies after a lone newline before a printable character), and the
// only look-ahead, \s+(?!\S), gives the one-byte piece "\n" both at the end of a text and before a
// printable character.
size_t Tokenizer::SafeCut(std::string_view text, size_t from) const {
  static const char* const kKnown[] = {
      kGpt2Pattern,
      // Llama 3
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      // Qwen 2
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
  };
  bool known = !steps_.empty();
  for (const PreStep& s : steps_) {
    if (s.add_prefix_space || s.remove_matches) known = false;
    if (s.regex &&
        std::find(std::begin(kKnown), std::end(kKnown), s.regex->pattern) == std::end(kKnown)) {
      known = false;
    }
  }
  for (const AddedToken& a : added_) {
    if (a.content.find('\n') != std::string::npos) known = false;
  }
  if (!known) return std::string_view::npos;
  auto printable = [](char c) { return c > ' ' && c < 0x7F; };
  for (size_t p = std::max<size_t>(from, 2); p < text.size(); ++p) {
    const void* nl = std::memchr(text.data() + p - 1, '\n', text.size() - (p - 1));
    if (nl == nullptr) break;
    p = static_cast<size_t>(static_cast<const char*>(nl) - text.data()) + 1;  // just after it
    if (p < 2 || p >= text.size()) break;
    if (printable(text[p - 2]) && printable(text[p]) &&
        !added_first_byte_[static_cast<unsigned char>(text[p])]) {
      return p;
    }
  }
  return std::string_view::npos;
}

}  // namespace meshrun
