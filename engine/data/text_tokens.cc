// Text tokenized with a Hugging Face tokenizer (docs/data.md "Tokenizers"): the files read,
// tokenized in parallel over files, joined with the end-of-text token, and cached as an llm.c
// token file named by a hash of the texts and of tokenizer.json.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "common/atomic_file.h"
#include "common/confined_file.h"
#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

// Bumped when the cache's content for the same key would change (e.g. a tokenizer fix).
constexpr uint64_t kCacheFormat = 1;

uint64_t Mix(uint64_t h, std::string_view bytes) {
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t Mix(uint64_t h, uint64_t v) {
  return Mix(h, std::string_view(reinterpret_cast<const char*>(&v), sizeof(v)));
}

struct TextFile {
  std::string path;
  std::string bytes;
};

}  // namespace

Status WriteLlmcTokens(const std::string& path, const std::vector<int32_t>& tokens,
                       int32_t vocab_size) {
  if (tokens.size() > 0x7FFFFFFFu) {
    return InvalidArgumentError(path + ": " + std::to_string(tokens.size()) +
                                " tokens do not fit the llm.c header's int32 count (hint: split "
                                "the inputs over several token files)");
  }
  const bool wide = vocab_size > 65535;
  const int width = wide ? 4 : 2;
  std::string out(kLlmcHeaderInts * 4 + tokens.size() * width, '\0');
  auto put32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) out[at + k] = static_cast<char>((v >> (8 * k)) & 0xFF);
  };
  put32(0, kLlmcMagic);
  put32(4, wide ? kLlmcVersionUint32 : kLlmcVersion);
  put32(8, static_cast<uint32_t>(tokens.size()));
  size_t at = kLlmcHeaderInts * 4;
  for (int32_t t : tokens) {
    const uint32_t v = static_cast<uint32_t>(t);
    out[at] = static_cast<char>(v & 0xFF);
    out[at + 1] = static_cast<char>((v >> 8) & 0xFF);
    if (wide) {
      out[at + 2] = static_cast<char>((v >> 16) & 0xFF);
      out[at + 3] = static_cast<char>((v >> 24) & 0xFF);
    }
    at += width;
  }
  return WriteFileAtomic(path, out);
}

StatusOr<TokenStream> TokenizeTexts(const std::vector<std::string>& inputs,
                                    std::shared_ptr<const Tokenizer> tokenizer,
                                    const LoadOptions& options) {
  TokenStream s;
  s.path = inputs.empty() ? std::string() : inputs.front();
  s.format = "text";
  s.vocab_size = tokenizer->vocab_size();

  // Read every file (the hash needs their bytes anyway); a folder's non-UTF-8 files are
  // skipped, a file named directly must be text.
  std::vector<TextFile> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (fs::is_directory(input, ec)) {
      std::vector<std::string> listed;
      std::vector<std::string> skipped;
      MESHRUN_RETURN_IF_ERROR(ListTextFolderForTokens(input, &listed, &skipped));
      size_t read = 0;
      for (const std::string& f : listed) {
        TextFile t{f, {}};
        MESHRUN_RETURN_IF_ERROR(ReadTextFile(f, &t.bytes));
        size_t bad = 0;
        if (!IsUtf8Text(t.bytes, &bad)) {
          skipped.push_back(fs::path(f).filename().string() + ": not UTF-8 text (byte " +
                            std::to_string(bad) + ")");
          continue;
        }
        if (t.bytes.empty()) continue;
        files.push_back(std::move(t));
        ++read;
      }
      if (read == 0) return EmptyTextFolderError(input, skipped);
      s.skipped.insert(s.skipped.end(), skipped.begin(), skipped.end());
    } else {
      if (!fs::exists(input, ec)) {
        return NotFoundError(input + ": no such file or folder (hint: check the path)");
      }
      TextFile t{input, {}};
      MESHRUN_RETURN_IF_ERROR(ReadTextFile(input, &t.bytes));
      size_t bad = 0;
      if (!IsUtf8Text(t.bytes, &bad)) {
        return InvalidArgumentError(input + ": not UTF-8 text (byte " + std::to_string(bad) +
                                    " is invalid) (hint: tokenize text files only)");
      }
      if (t.bytes.empty()) {
        return InvalidArgumentError(input + ": the file is empty (hint: give non-empty text)");
      }
      files.push_back(std::move(t));
    }
  }
  if (files.empty()) return InvalidArgumentError("no text to tokenize (hint: name text files)");
  const int32_t eot = tokenizer->end_of_text_id();
  if (files.size() > 1 && eot < 0) {
    return InvalidArgumentError(
        "data.tokenizer: the tokenizer has no end-of-text token to put between the " +
        std::to_string(files.size()) +
        " files (hint: set eos_token in tokenizer_config.json, or add <|endoftext|> as a special "
        "token)");
  }
  int64_t total_bytes = 0;
  for (const TextFile& f : files) {
    s.files.push_back(f.path);
    total_bytes += static_cast<int64_t>(f.bytes.size());
  }

  // The cache: the hash of (format, tokenizer, each file's size and bytes).
  if (!options.cache_dir.empty()) {
    uint64_t h = Mix(Mix(1469598103934665603ull, kCacheFormat), tokenizer->digest());
    for (const TextFile& f : files) h = Mix(Mix(h, uint64_t(f.bytes.size())), f.bytes);
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
    std::string stem = fs::path(s.path).filename().string();
    if (stem.empty()) stem = fs::path(s.path).parent_path().filename().string();
    s.cache_path = (fs::path(options.cache_dir) / (stem + "-" + hex + ".bin")).string();
    std::error_code ec;
    if (fs::is_regular_file(s.cache_path, ec)) {
      StatusOr<TokenStream> cached = LoadLlmcFile(s.cache_path);
      if (cached.ok()) {
        s.tokens = std::move(cached->tokens);
        s.max_token_id = cached->max_token_id;
        s.from_cache = true;
        if (options.progress) options.progress(total_bytes, total_bytes);
        return s;
      }
      // A damaged cache file is rebuilt below.
    }
  }

  // Tokenize, in parallel over files; each thread keeps its own encoder (and pre-token cache).
  std::vector<std::vector<int32_t>> ids(files.size());
  std::vector<Status> errors(files.size());
  std::atomic<size_t> next{0};
  std::atomic<int64_t> done_bytes{0};
  int threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp<int>(threads, 1, static_cast<int>(files.size()));
  auto work = [&] {
    TokenizerEncoder encoder(tokenizer.get());
    for (size_t i = next++; i < files.size(); i = next++) {
      ids[i].reserve(files[i].bytes.size() / 3);
      errors[i] = encoder.Encode(files[i].bytes, &ids[i]);
      const int64_t done = done_bytes += static_cast<int64_t>(files[i].bytes.size());
      if (options.progress) options.progress(done, total_bytes);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  size_t count = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!errors[i].ok()) {
      // A tokenizer at fault names its field first, then the file it failed on.
      const std::string& m = errors[i].message();
      const std::string field = "data.tokenizer: ";
      if (m.rfind(field, 0) == 0) {
        return InvalidArgumentError(field + files[i].path + ": " + m.substr(field.size()));
      }
      return InvalidArgumentError(files[i].path + ": " + m);
    }
    count += ids[i].size() + (i > 0 ? 1 : 0);
  }
  s.tokens.reserve(count);
  for (size_t i = 0; i < files.size(); ++i) {
    if (i > 0) s.tokens.push_back(eot);
    s.tokens.insert(s.tokens.end(), ids[i].begin(), ids[i].end());
    std::vector<int32_t>().swap(ids[i]);
  }
  for (int32_t t : s.tokens) s.max_token_id = std::max(s.max_token_id, t);
  if (s.tokens.empty()) {
    return InvalidArgumentError(s.path + ": the text gives no tokens (hint: give non-empty text)");
  }
  if (!s.cache_path.empty()) {
    MESHRUN_RETURN_IF_ERROR(CreateDirectoriesConfined(options.cache_dir));
    MESHRUN_RETURN_IF_ERROR(WriteLlmcTokens(s.cache_path, s.tokens, s.vocab_size));
  }
  return s;
}

}  // namespace meshrun
