// SentencePiece-style BPE from tokenizer.json (Llama 2, Mistral 7B v0.1, Gemma; docs/data.md
// "Tokenizers"): what the `tokenizers` library computes for a BPE model with byte_fallback,
// the normalizer Sequence [Prepend("▁"), Replace(" ", "▁")] or the Metaspace pre-tokenizer.
//
// Per text, as the library does: added tokens with normalized: false split out of the raw text;
// each segment normalized (Prepend to a non-empty segment, Replace of strings); added tokens
// with normalized: true split out of the normalized text; Metaspace (spaces → ▁, ▁ prepended by
// its prepend_scheme, split before each ▁); then per word: each character looked up whole, else
// its UTF-8 bytes as <0xNN> tokens (byte_fallback), else unk (fused runs with fuse_unk; a
// pending unk is emitted at the next character found whole, so after any byte tokens, as the
// library does), and merges by rank.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "engine/data/tokenizer.h"

namespace meshrun {
namespace {

using json = nlohmann::json;

constexpr const char* kMetaspace = "\xE2\x96\x81";  // ▁ U+2581

// Length of the UTF-8 character starting at `p[i]`, or 0 when the bytes there are not one.
size_t Utf8Length(std::string_view p, size_t i) {
  const auto c = static_cast<unsigned char>(p[i]);
  size_t len;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > p.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(p[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// The first byte that does not start a valid UTF-8 character, or npos.
size_t FirstNonUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t len = Utf8Length(text, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

bool IsSpaceByte(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

}  // namespace

// Splits `text` at `tokens` (longest first, so leftmost-longest matches; lstrip and rstrip take
// the white space beside a match): `segment(piece, offset)` for each non-empty stretch between
// matches, the match's id appended to `out`.
template <typename Tokens, typename Segment>
static void SplitAtAdded(std::string_view text, const Tokens& tokens, const bool* first_byte,
                         std::vector<int32_t>* out, Segment segment) {
  size_t seg = 0, i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (!first_byte[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const typename Tokens::value_type* hit = nullptr;
    for (const auto& a : tokens) {
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
      while (seg_end > seg && IsSpaceByte(text[seg_end - 1])) --seg_end;
    }
    if (seg_end > seg) segment(text.substr(seg, seg_end - seg), seg);
    out->push_back(hit->id);
    i += hit->content.size();
    if (hit->rstrip) {
      while (i < n && IsSpaceByte(text[i])) ++i;
    }
    seg = i;
  }
  if (seg < n) segment(text.substr(seg), seg);
}

Status Tokenizer::SpmParse(const json& j, const std::string& origin, Tokenizer* t) {
  auto bad = [&](const std::string& what, const std::string& hint) {
    return InvalidArgumentError("data.tokenizer: " + origin + ": " + what + " (hint: " + hint +
                                ")");
  };
  const char* kHint =
      "meshrun reads byte-level BPE (GPT-2, Llama 3) and SentencePiece-style BPE (Llama 2, "
      "Mistral, Gemma: normalizer Prepend/Replace or the Metaspace pre-tokenizer, byte "
      "fallback)";
  const json none;
  const json& model = j.contains("model") && j["model"].is_object() ? j["model"] : none;
  const json& norm = j.contains("normalizer") ? j["normalizer"] : none;
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : none;
  auto type_of = [](const json& x) {
    return x.is_object() ? x.value("type", std::string()) : std::string();
  };
  // Which style: byte fallback, a Metaspace pre-tokenizer or a Prepend/Replace normalizer.
  std::vector<json> norms;
  if (type_of(norm) == "Sequence") {
    for (const json& n : norm.value("normalizers", json::array())) norms.push_back(n);
  } else if (norm.is_object()) {
    norms.push_back(norm);
  }
  std::vector<json> pres;
  if (type_of(pre) == "Sequence") {
    for (const json& p : pre.value("pretokenizers", json::array())) pres.push_back(p);
  } else if (pre.is_object()) {
    pres.push_back(pre);
  }
  bool style = model.is_object() && model.value("byte_fallback", false);
  for (const json& n : norms) style |= type_of(n) == "Prepend" || type_of(n) == "Replace";
  for (const json& p : pres) style |= type_of(p) == "Metaspace";
  if (!style) return OkStatus();

  t->spm_ = true;
  t->meta_replacement_ = kMetaspace;
  for (const json& n : norms) {
    const std::string type = type_of(n);
    NormStep step;
    if (type == "Prepend" && n.contains("prepend") && n["prepend"].is_string() &&
        !n["prepend"].get<std::string>().empty()) {
      step.prepend = n["prepend"].get<std::string>();
    } else if (type == "Replace" && n.contains("pattern") && n["pattern"].is_object() &&
               n["pattern"].contains("String") && n["pattern"]["String"].is_string() &&
               !n["pattern"]["String"].get<std::string>().empty() && n.contains("content") &&
               n["content"].is_string()) {
      step.from = n["pattern"]["String"].get<std::string>();
      step.to = n["content"].get<std::string>();
    } else {
      return bad("normalizer " + (type.empty() ? n.dump() : type) +
                     (type == "Replace" ? " with a Regex pattern" : "") + " is not supported",
                 std::string(kHint) +
                     "; Prepend and Replace of a String are read, NFC, NFKC, "
                     "Precompiled and regex replacements are not");
    }
    t->normalizer_.push_back(std::move(step));
  }
  // Gemma's Split on a String the normalizer has already replaced everywhere (" " after
  // Replace(" ", "▁")) finds nothing to split: it is read as no pre-tokenizer.
  auto no_op_split = [&](const json& p) {
    if (type_of(p) != "Split" || p.value("invert", false) || !p.contains("pattern") ||
        !p["pattern"].is_object() || !p["pattern"].contains("String") ||
        !p["pattern"]["String"].is_string()) {
      return false;
    }
    const std::string pattern = p["pattern"]["String"].get<std::string>();
    bool gone = false;
    for (const NormStep& n : t->normalizer_) {
      const std::string& added = n.prepend.empty() ? n.to : n.prepend;
      if (n.prepend.empty() && n.from == pattern) gone = true;
      if (added.find(pattern) != std::string::npos) gone = false;
    }
    return !pattern.empty() && gone;
  };
  pres.erase(std::remove_if(pres.begin(), pres.end(), no_op_split), pres.end());
  for (const json& p : pres) {
    if (type_of(p) != "Metaspace" || pres.size() != 1) {
      return bad("pre_tokenizer " + type_of(p) + " with SentencePiece-style BPE is not supported",
                 std::string(kHint) +
                     "; its pre-tokenizer is none, one Metaspace, or a Split on a String the "
                     "normalizer has replaced (Gemma's)");
    }
    t->metaspace_ = true;
    t->meta_replacement_ = p.value("replacement", std::string(kMetaspace));
    if (t->meta_replacement_.empty()) return bad("Metaspace replacement is empty", "set \"▁\"");
    t->meta_split_ = p.value("split", true);
    std::string scheme = "always";
    if (p.contains("prepend_scheme") && p["prepend_scheme"].is_string()) {
      scheme = p["prepend_scheme"].get<std::string>();
    } else if (p.contains("add_prefix_space") && p["add_prefix_space"].is_boolean()) {
      scheme = p["add_prefix_space"].get<bool>() ? "always" : "never";  // older files
    }
    if (scheme == "always") {
      t->meta_prepend_ = kPrependAlways;
    } else if (scheme == "first") {
      t->meta_prepend_ = kPrependFirst;
    } else if (scheme == "never") {
      t->meta_prepend_ = kPrependNever;
    } else {
      return bad("Metaspace prepend_scheme " + scheme + " is not supported",
                 "use first, always or never");
    }
  }
  if (model.is_object()) {
    t->byte_fallback_ = model.value("byte_fallback", false);
    t->fuse_unk_ = model.value("fuse_unk", false);
  }
  // The decoder: one leading space stripped (Strip(" ", 1, 0) in a Sequence, or a Metaspace
  // decoder that prepends).
  const json& dec = j.contains("decoder") ? j["decoder"] : none;
  std::vector<json> decs;
  if (type_of(dec) == "Sequence") {
    for (const json& d : dec.value("decoders", json::array())) decs.push_back(d);
  } else if (dec.is_object()) {
    decs.push_back(dec);
  }
  for (const json& d : decs) {
    if (type_of(d) == "Strip" && d.value("content", std::string()) == " " &&
        d.value("start", 0) >= 1) {
      t->decode_strip_space_ = true;
    }
    if (type_of(d) == "Metaspace") {
      const std::string scheme = d.value("prepend_scheme", std::string("always"));
      t->decode_strip_space_ = scheme != "never" && d.value("add_prefix_space", true);
    }
  }
  return OkStatus();
}

std::string Tokenizer::SpmDecode(const std::vector<int32_t>& ids) const {
  // ByteFallback: a run of <0xNN> tokens becomes its bytes when they are UTF-8, else one U+FFFD
  // per token; the rest are the pieces with ▁ as a space; then Strip.
  std::string out, bytes;
  size_t run = 0;
  auto flush = [&] {
    if (run == 0) return;
    if (FirstNonUtf8(bytes) == std::string_view::npos) {
      out += bytes;
    } else {
      for (size_t k = 0; k < run; ++k) out += "\xEF\xBF\xBD";
    }
    bytes.clear();
    run = 0;
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    if (fallback_byte_[id] >= 0) {
      bytes.push_back(static_cast<char>(fallback_byte_[id]));
      ++run;
      continue;
    }
    flush();
    out += id_bytes_[id];
  }
  flush();
  if (decode_strip_space_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

Status TokenizerEncoder::SpmEncode(std::string_view text, std::vector<int32_t>* out) {
  if (const size_t bad = FirstNonUtf8(text); bad != std::string_view::npos) {
    return InvalidArgumentError("the text is not UTF-8 (byte " + std::to_string(bad) +
                                ") (hint: tokenize UTF-8 text)");
  }
  SplitAtAdded(
      text, tok_->added_, tok_->added_first_byte_, out,
      [&](std::string_view segment, size_t offset) { SpmSegment(segment, offset == 0, out); });
  return OkStatus();
}

void TokenizerEncoder::SpmSegment(std::string_view segment, bool at_start,
                                  std::vector<int32_t>* out) {
  std::string norm(segment);
  for (const Tokenizer::NormStep& n : tok_->normalizer_) {
    if (!n.prepend.empty()) {
      if (!norm.empty()) norm.insert(0, n.prepend);
      continue;
    }
    std::string next;
    next.reserve(norm.size() + norm.size() / 4);
    for (size_t at = 0;;) {
      const size_t hit = norm.find(n.from, at);
      next.append(norm, at, hit == std::string::npos ? std::string::npos : hit - at);
      if (hit == std::string::npos) break;
      next += n.to;
      at = hit + n.from.size();
    }
    norm.swap(next);
  }
  SplitAtAdded(norm, tok_->normalized_added_, tok_->norm_first_byte_, out,
               [&](std::string_view piece, size_t offset) {
                 SpmPiece(piece, at_start && offset == 0, out);
               });
}

void TokenizerEncoder::SpmPiece(std::string_view piece, bool at_start, std::vector<int32_t>* out) {
  if (!tok_->metaspace_) {
    SpmWord(piece, out);
    return;
  }
  const std::string& rep = tok_->meta_replacement_;
  std::string p;
  p.reserve(piece.size() + rep.size());
  for (char c : piece) {
    if (c == ' ') {
      p += rep;
    } else {
      p += c;
    }
  }
  const bool prepend = tok_->meta_prepend_ == Tokenizer::kPrependAlways ||
                       (tok_->meta_prepend_ == Tokenizer::kPrependFirst && at_start);
  if (prepend && p.compare(0, rep.size(), rep) != 0) p.insert(0, rep);
  if (!tok_->meta_split_) {
    SpmWord(p, out);
    return;
  }
  // Split before each replacement (MergedWithNext).
  const std::string_view v(p);
  size_t start = 0;
  for (size_t at = v.find(rep, 1); at != std::string_view::npos; at = v.find(rep, at + 1)) {
    if (at > start) SpmWord(v.substr(start, at - start), out);
    start = at;
  }
  if (start < v.size()) SpmWord(v.substr(start), out);
}

void TokenizerEncoder::SpmWord(std::string_view word, std::vector<int32_t>* out) {
  constexpr size_t kCachedBytes = 256;  // whole segments (no pre-tokenizer) are not cached
  const bool cached = word.size() <= kCachedBytes;
  if (cached) {
    spm_key_.assign(word);
    auto it = cache_.find(spm_key_);
    if (it != cache_.end()) {
      out->insert(out->end(), cache_ids_.begin() + it->second.first,
                  cache_ids_.begin() + it->second.first + it->second.second);
      return;
    }
  }
  const size_t before = out->size();
  auto known =
      tok_->ignore_merges_ ? tok_->word_ids_.find(std::string(word)) : tok_->word_ids_.end();
  if (known != tok_->word_ids_.end()) {
    out->push_back(known->second);
  } else {
    sym_id_.clear();
    int32_t unk = -1;  // a pending unk (fused while fuse_unk)
    for (size_t i = 0; i < word.size();) {
      const size_t len = std::max<size_t>(1, Utf8Length(word, i));
      spm_piece_.assign(word.substr(i, len));
      auto id = tok_->word_ids_.find(spm_piece_);
      if (id != tok_->word_ids_.end()) {
        if (unk >= 0) sym_id_.push_back(unk), unk = -1;
        sym_id_.push_back(id->second);
      } else {
        bool all = tok_->byte_fallback_;
        for (size_t k = 0; all && k < len; ++k) {
          all = tok_->fallback_id_[static_cast<unsigned char>(word[i + k])] >= 0;
        }
        if (all) {
          for (size_t k = 0; k < len; ++k) {
            sym_id_.push_back(tok_->fallback_id_[static_cast<unsigned char>(word[i + k])]);
          }
        } else if (tok_->unk_id_ >= 0) {
          if (unk >= 0 && !tok_->fuse_unk_) sym_id_.push_back(unk);
          unk = tok_->unk_id_;
        }
      }
      i += len;
    }
    if (unk >= 0) sym_id_.push_back(unk);
    RunMerges(out);
  }
  if (!cached) return;
  if (cache_.size() >= (1u << 20)) {
    cache_.clear();
    cache_ids_.clear();
  }
  cache_.emplace(spm_key_, std::make_pair(static_cast<uint32_t>(cache_ids_.size()),
                                          static_cast<uint32_t>(out->size() - before)));
  cache_ids_.insert(cache_ids_.end(), out->begin() + before, out->end());
}

}  // namespace meshrun
