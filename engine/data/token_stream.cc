// Loading token streams from text files, text folders, and llm.c / nanoGPT `.bin` files.
#include "engine/data/token_stream.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>

#include "common/confined_file.h"
#include "engine/data/tokenizer.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormatHint = "hint: use format auto, text, llmc or nanogpt";

// Reads a whole file into `out`.
Status ReadWholeFile(const fs::path& path, std::string* out) {
  MESHRUN_ASSIGN_OR_RETURN(ConfinedName name, ConfinedName::ForRead(path.string()));
  std::ifstream in(name.name(), std::ios::binary);
  if (!in)
    return NotFoundError(path.string() + ": cannot open for reading: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) return InternalError(path.string() + ": cannot determine the file size");
  in.seekg(0, std::ios::beg);
  out->resize(static_cast<size_t>(size));
  if (size > 0 && !in.read(out->data(), size)) {
    return DataLossError(path.string() + ": read failed after " + std::to_string(in.gcount()) +
                         " of " + std::to_string(size) + " bytes");
  }
  return OkStatus();
}

// Appends the `width`-byte (2 or 4) little-endian tokens of bytes [begin, begin + width·count)
// of `path` to `tokens`, reading in chunks so a large file never sits in memory twice.
Status ReadTokens(const fs::path& path, uint64_t begin, uint64_t count, int width,
                  std::vector<int32_t>* tokens, int32_t* max_id) {
  MESHRUN_ASSIGN_OR_RETURN(ConfinedName name, ConfinedName::ForRead(path.string()));
  std::ifstream in(name.name(), std::ios::binary);
  if (!in)
    return NotFoundError(path.string() + ": cannot open for reading: " + std::strerror(errno));
  in.seekg(static_cast<std::streamoff>(begin));
  tokens->reserve(tokens->size() + count);
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<unsigned char> buf(width * kChunk);
  uint64_t done = 0;
  while (done < count) {
    const uint64_t n = std::min(kChunk, count - done);
    if (!in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(width * n))) {
      return DataLossError(path.string() + ": read failed at token " + std::to_string(done) +
                           " of " + std::to_string(count));
    }
    for (uint64_t i = 0; i < n; ++i) {
      const unsigned char* b = buf.data() + width * i;  // little-endian
      uint32_t t = b[0] | (b[1] << 8);
      if (width == 4)
        t |= (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
      if (t > 0x7FFFFFFFu) {
        return DataLossError(path.string() + ": token " + std::to_string(done + i) + " is " +
                             std::to_string(t) + ", beyond any vocabulary (hint: re-create it)");
      }
      *max_id = std::max(*max_id, static_cast<int32_t>(t));
      tokens->push_back(static_cast<int32_t>(t));
    }
    done += n;
  }
  return OkStatus();
}

int32_t ReadLeInt32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) |
                              (static_cast<uint32_t>(p[3]) << 24));
}

void AppendBytes(const std::string& bytes, TokenStream* s) {
  s->tokens.reserve(s->tokens.size() + bytes.size());
  for (unsigned char c : bytes) {
    s->tokens.push_back(c);
    s->max_token_id = std::max<int32_t>(s->max_token_id, c);
  }
}

Status LoadLlmc(const fs::path& path, uint64_t file_size, TokenStream* s) {
  constexpr uint64_t kHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
  if (file_size < kHeaderBytes) {
    return InvalidArgumentError(path.string() + ": short file: " + std::to_string(file_size) +
                                " bytes, but an llm.c token file starts with a " +
                                std::to_string(kHeaderBytes) +
                                "-byte header (hint: for raw uint16 tokens use format nanogpt)");
  }
  MESHRUN_ASSIGN_OR_RETURN(ConfinedName name, ConfinedName::ForRead(path.string()));
  std::ifstream in(name.name(), std::ios::binary);
  unsigned char header[kHeaderBytes];
  if (!in || !in.read(reinterpret_cast<char*>(header), kHeaderBytes)) {
    return DataLossError(path.string() + ": cannot read the llm.c header");
  }
  const int32_t magic = ReadLeInt32(header);
  const int32_t version = ReadLeInt32(header + 4);
  const int32_t count = ReadLeInt32(header + 8);
  if (magic != kLlmcMagic) {
    return InvalidArgumentError(path.string() + ": bad magic " + std::to_string(magic) +
                                " in the llm.c header, expected " + std::to_string(kLlmcMagic) +
                                " (hint: for raw uint16 tokens use format nanogpt, for text "
                                "use format text)");
  }
  if (version != kLlmcVersion && version != kLlmcVersionUint32) {
    return InvalidArgumentError(path.string() + ": llm.c token file version " +
                                std::to_string(version) + " is not supported, expected " +
                                std::to_string(kLlmcVersion) + " (uint16 tokens) or " +
                                std::to_string(kLlmcVersionUint32) +
                                " (uint32 tokens) (hint: re-create it with meshrun tokenize)");
  }
  const int width = version == kLlmcVersionUint32 ? 4 : 2;
  if (count <= 0) {
    return InvalidArgumentError(path.string() + ": the llm.c header says " + std::to_string(count) +
                                " tokens; the stream is empty " +
                                "(hint: point data at a non-empty token file)");
  }
  const uint64_t expected = kHeaderBytes + width * static_cast<uint64_t>(count);
  if (file_size != expected) {
    return DataLossError(path.string() + ": the llm.c header says " + std::to_string(count) +
                         " tokens (" + std::to_string(expected) + " bytes with the header) but " +
                         "the file has " + std::to_string(file_size) + " bytes" +
                         (file_size < expected ? " (truncated; hint: re-create or re-copy it)"
                                               : " (hint: re-create or re-copy it)"));
  }
  return ReadTokens(path, kHeaderBytes, static_cast<uint64_t>(count), width, &s->tokens,
                    &s->max_token_id);
}

Status LoadNanogpt(const fs::path& path, uint64_t file_size, TokenStream* s) {
  if (file_size == 0) {
    return InvalidArgumentError(path.string() +
                                ": the file is empty (hint: point data at a non-empty token file)");
  }
  if (file_size % 2 != 0) {
    return InvalidArgumentError(path.string() + ": " + std::to_string(file_size) +
                                " bytes is an odd size; nanoGPT token files hold uint16 tokens "
                                "(hint: the file is truncated or not a token file; for text use "
                                "format text)");
  }
  return ReadTokens(path, 0, file_size / 2, 2, &s->tokens, &s->max_token_id);
}

Status LoadTextFile(const fs::path& path, TokenStream* s) {
  std::string bytes;
  MESHRUN_RETURN_IF_ERROR(ReadWholeFile(path, &bytes));
  size_t bad = 0;
  if (!IsUtf8Text(bytes, &bad)) {
    return InvalidArgumentError(path.string() + ": not UTF-8 text (byte " + std::to_string(bad) +
                                " is invalid) (hint: for token files use format llmc or nanogpt, "
                                "or name them *.bin so format auto recognises them)");
  }
  if (bytes.empty()) {
    return InvalidArgumentError(path.string() +
                                ": the file is empty (hint: point data at a non-empty text file)");
  }
  s->files.push_back(path.string());
  AppendBytes(bytes, s);
  return OkStatus();
}

// The files of a text folder, in file-name order (byte-wise order of the names, so the result
// does not depend on the locale). Only the folder's own entries are read. Skipped, and listed in
// *skipped: hidden files (".*"), sub-folders, special files, dangling symlinks, and symlinks
// whose target is another entry of the folder or an earlier symlink (packages like fortune ship
// such aliases; reading them would duplicate text). The caller skips files that are not UTF-8
// text (e.g. fortune's binary `.dat` index files).
Status ListTextFolder(const fs::path& dir, std::vector<fs::path>* files,
                      std::vector<std::string>* skipped) {
  std::error_code ec;
  std::vector<fs::directory_entry> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    entries.push_back(*it);
  }
  if (ec) return NotFoundError(dir.string() + ": cannot list the folder: " + ec.message());
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.path().filename().string() < b.path().filename().string();
  });

  // Canonical paths of the folder's regular (non-symlink) files, to recognise aliases.
  std::set<std::string> regular;
  for (const auto& e : entries) {
    if (!e.is_symlink(ec) && e.is_regular_file(ec)) {
      regular.insert(fs::weakly_canonical(e.path(), ec).string());
    }
  }
  std::set<std::string> read_targets;
  for (const auto& e : entries) {
    const std::string name = e.path().filename().string();
    auto skip = [&](const std::string& why) { skipped->push_back(name + ": " + why); };
    if (!name.empty() && name[0] == '.') {
      skip("hidden file");
      continue;
    }
    if (e.is_symlink(ec)) {
      const fs::path target = fs::canonical(e.path(), ec);
      if (ec) {
        skip("dangling symlink");
        continue;
      }
      if (regular.count(target.string()) || read_targets.count(target.string())) {
        skip("symlink to " + target.filename().string() + ", which is read already");
        continue;
      }
    }
    if (e.is_directory(ec)) {
      skip("a folder (only the folder's own files are read)");
      continue;
    }
    if (!e.is_regular_file(ec)) {
      skip("not a regular file");
      continue;
    }
    read_targets.insert(fs::weakly_canonical(e.path(), ec).string());
    files->push_back(e.path());
  }
  return OkStatus();
}

Status EmptyFolderError(const fs::path& dir, const std::vector<std::string>& skipped) {
  std::string msg = dir.string() + ": the folder holds no non-empty UTF-8 text files";
  if (!skipped.empty()) {
    msg += " (skipped: ";
    for (size_t i = 0; i < skipped.size() && i < 5; ++i) {
      msg += i ? "; " : "";
      msg += skipped[i];
    }
    if (skipped.size() > 5) msg += "; ...";
    msg += ")";
  }
  return InvalidArgumentError(msg + " (hint: point data at a text file or a folder of them)");
}

// A folder of text files, concatenated in file-name order, as bytes (see ListTextFolder).
Status LoadTextFolder(const fs::path& dir, TokenStream* s) {
  std::vector<fs::path> files;
  MESHRUN_RETURN_IF_ERROR(ListTextFolder(dir, &files, &s->skipped));
  for (const fs::path& f : files) {
    std::string bytes;
    MESHRUN_RETURN_IF_ERROR(ReadWholeFile(f, &bytes));
    size_t bad = 0;
    if (!IsUtf8Text(bytes, &bad)) {
      s->skipped.push_back(f.filename().string() + ": not UTF-8 text (byte " + std::to_string(bad) +
                           ")");
      continue;
    }
    s->files.push_back(f.string());
    AppendBytes(bytes, s);
  }
  if (s->tokens.empty()) return EmptyFolderError(dir, s->skipped);
  return OkStatus();
}

// Text read with options.tokenizer (text_tokens.cc).
StatusOr<TokenStream> LoadTokenizedText(const std::string& path, const LoadOptions& options) {
  MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> tokenizer,
                           Tokenizer::Load(options.tokenizer));
  MESHRUN_ASSIGN_OR_RETURN(TokenStream s, TokenizeTexts({path}, tokenizer, options));
  s.path = path;
  return s;
}

}  // namespace

Status ListTextFolderForTokens(const std::string& dir, std::vector<std::string>* files,
                               std::vector<std::string>* skipped) {
  std::vector<fs::path> paths;
  MESHRUN_RETURN_IF_ERROR(ListTextFolder(dir, &paths, skipped));
  for (const fs::path& p : paths) files->push_back(p.string());
  return OkStatus();
}

Status EmptyTextFolderError(const std::string& dir, const std::vector<std::string>& skipped) {
  return EmptyFolderError(dir, skipped);
}

Status ReadTextFile(const std::string& path, std::string* bytes) {
  return ReadWholeFile(path, bytes);
}

StatusOr<std::string> ResolveDataFormat(const std::string& path, const std::string& format) {
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return std::string("text");
  if (format != "auto") return format;
  const uint64_t size = fs::file_size(p, ec);
  if (ec) return NotFoundError(path + ": cannot read the file size: " + ec.message());
  unsigned char head[4] = {0, 0, 0, 0};
  if (size >= 4) {
    MESHRUN_ASSIGN_OR_RETURN(ConfinedName name, ConfinedName::ForRead(p.string()));
    std::ifstream in(name.name(), std::ios::binary);
    in.read(reinterpret_cast<char*>(head), 4);
  }
  if (size >= 4 && ReadLeInt32(head) == kLlmcMagic) return std::string("llmc");
  if (p.extension() == ".bin") return std::string("nanogpt");
  return std::string("text");
}

LoadOptions LoadOptionsOf(const JobSpec& spec) {
  LoadOptions o;
  o.tokenizer = spec.data.tokenizer;
  if (!spec.checkpoint.dir.empty()) {
    o.cache_dir = (fs::path(spec.checkpoint.dir) / kTokenCacheFolder).string();
  }
  if (spec.resources.threads > 0) o.threads = spec.resources.threads;
  return o;
}

namespace {
Status TextVocabError(int32_t text_vocab, const JobSpec& spec, const std::string& field) {
  const std::string model = std::to_string(spec.model.vocab_size);
  const std::string text = std::to_string(text_vocab);
  if (spec.data.tokenizer.empty()) {
    return InvalidArgumentError(
        "model.vocab_size: " + model + ", but " + field + " is byte-level text (vocabulary " +
        text +
        ") (hint: set model.vocab_size: 256, or set data.tokenizer to the tokenizer the "
        "model was made for)");
  }
  // Only a tokenizer larger than the model is an error: a larger model is padded.
  return InvalidArgumentError(
      "model.vocab_size: " + model + ", but data.tokenizer (" + spec.data.tokenizer +
      ") has a vocabulary of " + text + ", more ids than the model's embedding holds (hint: " +
      (spec.model.init_from.empty()
           ? "set model.vocab_size: " + text + " or more, or use the model's own tokenizer)"
           : "use the tokenizer model.init_from was made with; its config.json fixes "
             "vocab_size)"));
}

// Text's vocabulary fits the model: exactly 256 for bytes, at most model.vocab_size for a
// tokenizer's ids (the rows above are padding, never produced).
bool TextVocabFits(int32_t text_vocab, const JobSpec& spec) {
  return spec.data.tokenizer.empty() ? text_vocab == spec.model.vocab_size
                                     : text_vocab <= spec.model.vocab_size;
}
}  // namespace

std::string PaddedVocabNote(int32_t tokenizer_vocab, int32_t model_vocab) {
  if (tokenizer_vocab >= model_vocab) return std::string();
  return "model.vocab_size " + std::to_string(model_vocab) + " > the tokenizer's " +
         std::to_string(tokenizer_vocab) + " ids: ids " + std::to_string(tokenizer_vocab) +
         "\u2013" + std::to_string(model_vocab - 1) + " are padding, never produced";
}

Status CheckTextVocab(const JobSpec& spec, const std::string& field, std::string* note) {
  int32_t vocab = 256;
  if (!spec.data.tokenizer.empty()) {
    MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> tok,
                             Tokenizer::Load(spec.data.tokenizer));
    vocab = tok->vocab_size();
  }
  if (!TextVocabFits(vocab, spec)) return TextVocabError(vocab, spec, field);
  if (note != nullptr && !spec.data.tokenizer.empty()) {
    *note = PaddedVocabNote(vocab, spec.model.vocab_size);
  }
  return OkStatus();
}

Status CheckStreamVocab(const TokenStream& stream, const JobSpec& spec, const std::string& field) {
  if (stream.format == "text" && !TextVocabFits(stream.vocab_size, spec)) {
    return TextVocabError(stream.vocab_size, spec, field);
  }
  if (stream.max_token_id >= spec.model.vocab_size) {
    return InvalidArgumentError(
        "model.vocab_size: token id " + std::to_string(stream.max_token_id) + " in " + stream.path +
        " (" + field + ") is not below vocab_size(" + std::to_string(spec.model.vocab_size) +
        ") (hint: raise model.vocab_size or use data tokenized with a smaller vocabulary)");
  }
  return OkStatus();
}

Status CheckStreamWindow(const TokenStream& stream, const JobSpec& spec, const std::string& field) {
  const int64_t need = static_cast<int64_t>(spec.model.seq_len) + 1;
  if (stream.size() >= need) return OkStatus();
  return InvalidArgumentError(
      field + ": " + stream.path + " has " + std::to_string(stream.size()) +
      " tokens, fewer than one window of model.seq_len + 1 = " + std::to_string(need) +
      " (hint: use more data or a smaller model.seq_len, e.g. --set "
      "model.seq_len=" +
      std::to_string(std::max<int64_t>(1, stream.size() - 1)) + ")");
}

StatusOr<TokenStream> LoadLlmcFile(const std::string& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return NotFoundError(path + ": cannot read the file size: " + ec.message());
  TokenStream s;
  s.path = path;
  s.format = "llmc";
  MESHRUN_RETURN_IF_ERROR(LoadLlmc(path, size, &s));
  return s;
}

bool IsUtf8Text(const std::string& bytes, size_t* bad_offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  auto fail = [&](size_t at) {
    if (bad_offset) *bad_offset = at;
    return false;
  };
  while (i < n) {
    const unsigned char c = p[i];
    if (c == 0) return fail(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07;
    } else {
      return fail(i);  // continuation byte, overlong lead (C0, C1) or > U+10FFFF lead
    }
    if (i + len > n) return fail(i);
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return fail(i + k);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return fail(i);
    }
    i += len;
  }
  return true;
}

StatusOr<TokenStream> LoadTokens(const std::string& path, const std::string& format,
                                 const LoadOptions& options) {
  if (format != "auto" && format != "text" && format != "llmc" && format != "nanogpt") {
    return InvalidArgumentError("unknown data format '" + format + "' for " + path + " (" +
                                kFormatHint + ")");
  }
  if (path.empty()) {
    return InvalidArgumentError(
        "the data path is empty (hint: set data.train to a file or folder)");
  }
  std::error_code ec;
  const fs::path p(path);
  const fs::file_status st = fs::status(p, ec);
  if (ec || !fs::exists(st)) {
    return NotFoundError(path +
                         ": no such file or folder (hint: check the path; relative paths "
                         "are resolved from the working directory)");
  }

  TokenStream s;
  s.path = path;
  if (fs::is_directory(st)) {
    if (format == "llmc" || format == "nanogpt") {
      return InvalidArgumentError(path + ": is a folder, but format " + format +
                                  " reads a single .bin file (hint: use format text for a folder "
                                  "of text files, or point data at the .bin file)");
    }
    if (!options.tokenizer.empty()) return LoadTokenizedText(path, options);
    s.format = "text";
    s.vocab_size = 256;
    MESHRUN_RETURN_IF_ERROR(LoadTextFolder(p, &s));
    return s;
  }
  if (!fs::is_regular_file(st)) {
    return InvalidArgumentError(path + ": not a regular file or folder");
  }
  const uint64_t size = fs::file_size(p, ec);
  if (ec) return InternalError(path + ": cannot read the file size: " + ec.message());

  MESHRUN_ASSIGN_OR_RETURN(std::string resolved, ResolveDataFormat(path, format));
  s.format = resolved;
  if (resolved == "llmc") {
    MESHRUN_RETURN_IF_ERROR(LoadLlmc(p, size, &s));
    s.files.push_back(path);
  } else if (resolved == "nanogpt") {
    MESHRUN_RETURN_IF_ERROR(LoadNanogpt(p, size, &s));
    s.files.push_back(path);
  } else if (!options.tokenizer.empty()) {
    return LoadTokenizedText(path, options);
  } else {
    s.vocab_size = 256;
    MESHRUN_RETURN_IF_ERROR(LoadTextFile(p, &s));
  }
  return s;
}

}  // namespace meshrun
