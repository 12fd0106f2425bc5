// `meshrun tokenize`: text files, JSONL files (one document per record), folders and globs of
// them tokenized as data.train reads a text folder (the same ids, the end-of-text token between
// documents), streamed: a reader cuts the inputs into chunks at document boundaries or at cuts
// that cannot change the ids (Tokenizer::SafeCut), a pool of threads encodes them, and the ids are
// written in order into one llm.c file or into shards of --shard-tokens tokens with a
// manifest.json that makes an interrupted run resumable (docs/data.md "Making token files"; the
// shard writer and the manifest are client/tokenize_shards.cc).
// Instruction data (--template, --masks, --seq-len) goes to client/tokenize_instruction.cc.
#include "client/tokenize_command.h"

#include <glob.h>
#include <openssl/evp.h>
#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/command.h"
#include "client/coordinator_client.h"
#include "client/tokenize_shards.h"
#include "client/tokenize_shared.h"
#include "engine/data/instruction.h"
#include "engine/data/mapped_tokens.h"
#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kMaxLlmcTokens = 0x7FFFFFFF;  // the llm.c header's int32 count

bool IsJsonl(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".jsonl";
}

// The cores this process may run on (its affinity mask: taskset, cgroup cpusets).
int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// Whether a file is UTF-8 text as IsUtf8Text judges it, read in blocks (never whole).
StatusOr<bool> FileIsUtf8(const std::string& path, size_t* bad) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return NotFoundError(path + ": cannot open: " + std::strerror(errno));
  std::string buf, carry;
  size_t base = 0;
  std::vector<char> block(1 << 20);
  bool ok = true;
  for (;;) {
    const size_t n = std::fread(block.data(), 1, block.size(), f);
    const bool eof = n < block.size();
    buf = carry;
    buf.append(block.data(), n);
    // Keep a possibly incomplete last character for the next block.
    size_t cut = buf.size();
    if (!eof) {
      size_t back = 0;
      while (back < 3 && cut > 0 && (static_cast<unsigned char>(buf[cut - 1]) & 0xC0) == 0x80) {
        --cut, ++back;
      }
      if (cut > 0 && static_cast<unsigned char>(buf[cut - 1]) >= 0xC0) --cut;
    }
    carry = buf.substr(cut);
    buf.resize(cut);
    size_t at = 0;
    if (!IsUtf8Text(buf, &at)) {
      *bad = base + at;
      ok = false;
      break;
    }
    base += cut;
    if (eof) break;
  }
  std::fclose(f);
  return ok;
}

bool HasGlobChars(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

}  // namespace

// The inputs as files in stream order: folders as data.train lists them (name order, a folder's
// files that are not UTF-8 skipped, JSONL files by their .jsonl extension), globs expanded in
// byte order of the names.
Status ListInputs(const std::vector<std::string>& inputs, int threads,
                  std::vector<InputFile>* files, std::vector<std::string>* skipped_all) {
  auto add_file = [&](const std::string& path) -> Status {
    std::error_code ec;
    const int64_t size = static_cast<int64_t>(fs::file_size(path, ec));
    if (ec) return NotFoundError(path + ": cannot read the file size: " + ec.message());
    if (size == 0) {
      return InvalidArgumentError(path + ": the file is empty (hint: give non-empty text)");
    }
    files->push_back({path, size, IsJsonl(path)});
    return OkStatus();
  };
  for (const std::string& input : inputs) {
    std::error_code ec;
    std::vector<std::string> named;
    if (fs::exists(input, ec) || !HasGlobChars(input)) {
      named.push_back(input);
    } else {
      glob_t g{};
      const int rc = glob(input.c_str(), GLOB_NOSORT, nullptr, &g);
      for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) named.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      if (named.empty()) {
        return NotFoundError(input + ": no file matches the pattern (hint: check the pattern)");
      }
      std::sort(named.begin(), named.end());
    }
    for (const std::string& path : named) {
      if (fs::is_directory(path, ec)) {
        std::vector<std::string> listed, skipped;
        MESHRUN_RETURN_IF_ERROR(ListTextFolderForTokens(path, &listed, &skipped));
        // A folder's text files that are not UTF-8 are skipped, as data.train skips them: each is
        // checked in full first (in parallel), so that skipping one cannot change what was
        // already written.
        std::vector<int64_t> bad(listed.size(), -1);
        std::vector<Status> errors(listed.size());
        std::atomic<size_t> next{0};
        auto work = [&] {
          for (size_t i = next++; i < listed.size(); i = next++) {
            if (IsJsonl(listed[i])) continue;
            size_t at = 0;
            StatusOr<bool> ok = FileIsUtf8(listed[i], &at);
            if (!ok.ok()) {
              errors[i] = ok.status();
            } else if (!*ok) {
              bad[i] = static_cast<int64_t>(at);
            }
          }
        };
        std::vector<std::thread> pool;
        const int n =
            std::clamp<int>(threads, 1, static_cast<int>(std::max<size_t>(1, listed.size())));
        for (int t = 1; t < n; ++t) pool.emplace_back(work);
        work();
        for (std::thread& t : pool) t.join();
        size_t read = 0;
        for (size_t i = 0; i < listed.size(); ++i) {
          MESHRUN_RETURN_IF_ERROR(errors[i]);
          if (bad[i] >= 0) {
            skipped.push_back(fs::path(listed[i]).filename().string() + ": not UTF-8 text (byte " +
                              std::to_string(bad[i]) + ")");
            continue;
          }
          const int64_t size = static_cast<int64_t>(fs::file_size(listed[i], ec));
          if (ec || size == 0) continue;
          files->push_back({listed[i], size, IsJsonl(listed[i])});
          ++read;
        }
        if (read == 0) return EmptyTextFolderError(path, skipped);
        skipped_all->insert(skipped_all->end(), skipped.begin(), skipped.end());
      } else if (fs::exists(path, ec)) {
        MESHRUN_RETURN_IF_ERROR(add_file(path));
      } else {
        return NotFoundError(path + ": no such file or folder (hint: check the path)");
      }
    }
  }
  if (files->empty()) return InvalidArgumentError("no text to tokenize (hint: name text files)");
  return OkStatus();
}

// The end-of-text error, as TokenizeTexts words it.
Status NoEndOfTextError(const std::string& between) {
  return InvalidArgumentError(
      "data.tokenizer: the tokenizer has no end-of-text token to put between the " + between +
      " (hint: set eos_token in tokenizer_config.json, or add <|endoftext|> as a special token)");
}

Status TokenizerError(const Status& s, const std::string& where) {
  const std::string& m = s.message();
  const std::string field = "data.tokenizer: ";
  if (m.rfind(field, 0) == 0) {
    return InvalidArgumentError(field + where + ": " + m.substr(field.size()));
  }
  return InvalidArgumentError(where + ": " + m);
}

namespace {

// A unit of work: bytes of one file, cut at a document boundary or a safe cut.
struct Chunk {
  uint64_t seq = 0;
  InputPosition at;
  std::string bytes;
  int64_t length = 0;  // bytes.size() as read (bytes is freed once encoded)
  bool eof = false;    // the end of the inputs (no bytes)
  Status error;        // from the reader, or from encoding
  // Encoding's result: the ids, with the end-of-text token between this chunk's documents.
  std::vector<int32_t> ids;
  bool has_doc = false;     // holds (the start or a part of) a non-empty document
  bool starts_doc = false;  // its first document starts in this chunk
};

// Encodes one chunk (a worker thread, with its own encoder).
void EncodeChunk(Chunk* c, const InputFile& file, const std::string& field, int32_t eot,
                 TokenizerEncoder* encoder) {
  if (!file.jsonl) {
    size_t bad = 0;
    if (!IsUtf8Text(c->bytes, &bad)) {
      c->error = InvalidArgumentError(file.path + ": not UTF-8 text (byte " +
                                      std::to_string(c->at.offset + static_cast<int64_t>(bad)) +
                                      " is invalid) (hint: tokenize text files only)");
      return;
    }
    c->ids.reserve(c->bytes.size() / 3);
    if (Status s = encoder->Encode(c->bytes, &c->ids); !s.ok()) {
      c->error = TokenizerError(s, file.path);
      return;
    }
    c->has_doc = true;
    c->starts_doc = c->at.offset == 0;
    return;
  }
  c->starts_doc = true;
  int64_t line = c->at.line;
  size_t pos = 0;
  while (pos < c->bytes.size()) {
    size_t end = c->bytes.find('\n', pos);
    if (end == std::string::npos) end = c->bytes.size();
    std::string_view rec(c->bytes.data() + pos, end - pos);
    pos = end + 1;
    const std::string where = file.path + ":" + std::to_string(line);
    ++line;
    if (rec.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // a blank line
    json j = json::parse(rec.begin(), rec.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      c->error = InvalidArgumentError(where +
                                      ": not a JSON object (hint: give one JSON object "
                                      "per line, UTF-8)");
      return;
    }
    auto it = j.find(field);
    if (it == j.end()) {
      c->error = InvalidArgumentError(where + ": the record has no \"" + field +
                                      "\" field (hint: name the text field with --field NAME)");
      return;
    }
    if (!it->is_string()) {
      c->error = InvalidArgumentError(where + ": \"" + field + "\" is " + it->type_name() +
                                      ", not a string (hint: name the text field with --field "
                                      "NAME)");
      return;
    }
    const std::string& text = it->get_ref<const std::string&>();
    if (text.empty()) continue;  // an empty document, as an empty file of a folder
    size_t bad = 0;
    if (!IsUtf8Text(text, &bad)) {
      c->error = InvalidArgumentError(where + ": \"" + field + "\" is not UTF-8 text (byte " +
                                      std::to_string(bad) +
                                      " is invalid, e.g. a NUL) (hint: "
                                      "tokenize text only)");
      return;
    }
    if (c->has_doc) {
      if (eot < 0) {
        c->error = NoEndOfTextError("records of " + file.path);
        return;
      }
      c->ids.push_back(eot);
    }
    if (Status s = encoder->Encode(text, &c->ids); !s.ok()) {
      c->error = TokenizerError(s, where);
      return;
    }
    c->has_doc = true;
  }
}

// Reads the inputs from `start` on and hands out chunks of about `chunk_bytes` (more when no cut
// is found sooner: a JSONL line, or text without a safe cut, is never split).
class ChunkReader {
 public:
  ChunkReader(const std::vector<InputFile>& files, const Tokenizer& tokenizer, int64_t chunk_bytes,
              InputPosition start)
      : files_(files), tok_(tokenizer), chunk_(static_cast<size_t>(chunk_bytes)), at_(start) {}
  ~ChunkReader() {
    if (f_ != nullptr) std::fclose(f_);
  }

  // The next chunk (eof at the end, or an error).
  Chunk Next() {
    Chunk c;
    for (;;) {
      if (at_.file >= static_cast<int>(files_.size())) {
        c.eof = true;
        return c;
      }
      const InputFile& file = files_[at_.file];
      if (f_ == nullptr) {
        f_ = std::fopen(file.path.c_str(), "rb");
        if (f_ == nullptr) {
          c.error = NotFoundError(file.path + ": cannot open: " + std::strerror(errno));
          return c;
        }
        if (at_.offset > 0 && fseeko(f_, at_.offset, SEEK_SET) != 0) {
          c.error = InternalError(file.path + ": cannot seek: " + std::strerror(errno));
          return c;
        }
        pending_.clear();
        eof_ = false;
        searched_ = 0;
      }
      // Read until a cut at or after chunk_ bytes is found, or the file ends.
      size_t cut = std::string::npos;
      for (;;) {
        if (pending_.size() >= chunk_) {
          const size_t from = std::max(chunk_, searched_);
          if (file.jsonl) {
            const size_t nl = pending_.find('\n', from - 1);
            if (nl != std::string::npos) cut = nl + 1;
          } else {
            cut = tok_.SafeCut(pending_, from);
          }
          if (cut != std::string::npos) break;
          searched_ = pending_.size() > 2 ? pending_.size() - 2 : 0;
        }
        if (eof_) break;
        const size_t old = pending_.size();
        const size_t want = std::max<size_t>(chunk_, 1 << 16);
        pending_.resize(old + want);
        const size_t n = std::fread(pending_.data() + old, 1, want, f_);
        pending_.resize(old + n);
        if (n < want) {
          if (std::ferror(f_)) {
            c.error = InternalError(file.path + ": read error: " + std::strerror(errno));
            return c;
          }
          eof_ = true;
        }
      }
      if (cut == std::string::npos) cut = pending_.size();  // the rest of the file
      if (cut == 0) {                                       // the file is done
        std::fclose(f_);
        f_ = nullptr;
        at_ = InputPosition{at_.file + 1, 0, 1};
        continue;
      }
      c.at = at_;
      c.bytes.assign(pending_.data(), cut);
      c.length = static_cast<int64_t>(cut);
      pending_.erase(0, cut);
      searched_ = 0;
      at_.offset += static_cast<int64_t>(cut);
      if (file.jsonl) at_.line += std::count(c.bytes.begin(), c.bytes.end(), '\n');
      return c;
    }
  }

 private:
  const std::vector<InputFile>& files_;
  const Tokenizer& tok_;
  const size_t chunk_;
  InputPosition at_;
  std::FILE* f_ = nullptr;
  std::string pending_;
  bool eof_ = false;
  size_t searched_ = 0;
};

StatusOr<std::string> Sha256OfFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return NotFoundError(path + ": cannot open: " + std::strerror(errno));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 16);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) EVP_DigestUpdate(ctx, buf.data(), n);
  std::fclose(f);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    char b[3];
    std::snprintf(b, sizeof(b), "%02x", md[i]);
    hex += b;
  }
  return hex;
}

// Progress on stderr: a bar redrawn with \r on a terminal (at most 10 times a second), else a
// plain line every 10 seconds.
class Progress {
 public:
  Progress(bool show, bool terminal, int64_t total, int64_t done)
      : show_(show), terminal_(terminal), total_(total), start_done_(done) {}

  void Update(int64_t done, int64_t tokens, int shards, bool last = false) {
    if (!show_) return;
    const auto now = std::chrono::steady_clock::now();
    const auto every = terminal_ ? std::chrono::milliseconds(100) : std::chrono::seconds(10);
    if (!last && now - last_ < every) return;
    if (!last && !terminal_ && now - start_ < every) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double rate = secs > 0 ? (done - start_done_) / secs : 0;  // bytes/s in this run
    std::string eta = "ETA -";
    if (rate > 0) eta = "ETA " + FormatDuration((total_ - done) / rate);
    const double pct = total_ > 0 ? 100.0 * done / total_ : 100.0;
    char line[256];
    if (terminal_) {
      const int width = 30;
      const int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
      std::snprintf(line, sizeof(line),
                    "\r[%s%s] %.1f/%.1f MB  %.1f MB/s  %s tokens  %d shards  %s ",
                    std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                    done / 1e6, total_ / 1e6, rate / 1e6, FormatCount(tokens).c_str(), shards,
                    last ? "done" : eta.c_str());
    } else {
      std::snprintf(line, sizeof(line),
                    "tokenize: %.1f/%.1f MB (%.0f%%)  %.1f MB/s  %s tokens  %d shards  %s\n",
                    done / 1e6, total_ / 1e6, pct, rate / 1e6, FormatCount(tokens).c_str(), shards,
                    last ? "done" : eta.c_str());
    }
    std::fputs(line, stderr);
    if (terminal_ && last) std::fputs("\n", stderr);
    std::fflush(stderr);
  }

 private:
  static std::string FormatCount(int64_t n) {
    std::string s = std::to_string(n);
    for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(i, ",");
    return s;
  }
  const bool show_, terminal_;
  const int64_t total_, start_done_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_ - std::chrono::hours(1);
};

int RunTokenize(const TokenizeFlags& o) {
  StatusOr<std::shared_ptr<const Tokenizer>> loaded = Tokenizer::Load(o.tokenizer);
  if (!loaded.ok()) {
    std::string m = loaded.status().message();
    if (m.rfind("data.tokenizer: ", 0) == 0) m = "--tokenizer: " + m.substr(16);
    return ReportError(Status(loaded.status().code(), m));
  }
  const Tokenizer& tok = **loaded;
  const int threads = o.threads > 0 ? o.threads : UsableCores();
  if (o.masks || !o.chat_template.empty() || o.seq_len > 0 || o.pack) {
    return RunInstructionTokenize(o, *loaded, threads);
  }
  const bool sharded = o.shard_tokens > 0;
  const int32_t eot = tok.end_of_text_id();

  std::vector<InputFile> files;
  std::vector<std::string> skipped;
  if (Status s = ListInputs(o.inputs, threads, &files, &skipped); !s.ok()) return ReportError(s);
  if (files.size() > 1 && eot < 0) {
    return ReportError(NoEndOfTextError(std::to_string(files.size()) + " files"));
  }
  std::vector<int64_t> file_base(files.size() + 1, 0);  // bytes before each file
  for (size_t i = 0; i < files.size(); ++i) file_base[i + 1] = file_base[i] + files[i].size;

  // The manifest's fixed part: what makes two runs' outputs the same.
  StatusOr<std::string> sha = Sha256OfFile((fs::path(o.tokenizer) / "tokenizer.json").string());
  if (!sha.ok()) return ReportError(sha.status());
  const int version = tok.vocab_size() > 65535 ? kLlmcVersionUint32 : kLlmcVersion;
  json head = {{"format", kShardManifestFormat},
               {"version", 1},
               {"tokenizer",
                {{"path", o.tokenizer},
                 {"tokenizer_json_sha256", *sha},
                 {"vocab_size", tok.vocab_size()},
                 {"end_of_text_id", eot}}},
               {"llmc_version", version},
               {"field", o.field},
               {"shard_tokens", o.shard_tokens},
               {"chunk_bytes", o.chunk_bytes},
               {"prefix", o.prefix}};
  json input_list = json::array();
  for (const InputFile& f : files) {
    input_list.push_back({{"path", f.path}, {"bytes", f.size}, {"jsonl", f.jsonl}});
  }
  head["inputs"] = input_list;

  const std::string dir = o.output;
  std::unique_ptr<ShardFolder> folder;  // the folder, held for the whole run, and its manifest
  ShardEnd resume;                      // where a resumed run starts
  int64_t done_tokens = 0;
  bool complete = false;
  if (sharded) {
    StatusOr<std::unique_ptr<ShardFolder>> opened = ShardFolder::Open(dir, o.prefix, head);
    if (!opened.ok()) return ReportError(opened.status());
    folder = std::move(opened).value();
    resume = folder->resume();
    done_tokens = folder->done_tokens();
    complete = folder->complete();
  }
  InputPosition start = resume.chunk;
  int64_t skip = resume.skip;
  bool emitted = resume.emitted_before;
  const size_t resumed = sharded ? folder->shards().size() : 0;

  auto summary = [&](int64_t tokens) {
    if (sharded) {
      std::fprintf(stderr,
                   "%s: %lld tokens in %zu shards of up to %lld tokens from %zu files (vocabulary "
                   "%d, llm.c version %d)%s; %s\n",
                   dir.c_str(), static_cast<long long>(tokens), folder->shards().size(),
                   static_cast<long long>(o.shard_tokens), files.size(), tok.vocab_size(), version,
                   resumed > 0 ? (" (" + std::to_string(resumed) + " reused)").c_str() : "",
                   folder->manifest_path().c_str());
    } else {
      std::fprintf(stderr, "%s: %lld tokens from %zu files (vocabulary %d, llm.c version %d)\n",
                   o.output.c_str(), static_cast<long long>(tokens), files.size(), tok.vocab_size(),
                   version);
    }
  };
  if (complete) {
    summary(done_tokens);
    return kExitOk;
  }

  auto name = [&](int index) {
    if (!sharded) return o.output;
    char b[32];
    std::snprintf(b, sizeof(b), "_%06d.bin", index);
    return (fs::path(dir) / (o.prefix + b)).string();
  };
  auto on_shard = [&](const ShardRecord& r) -> Status {
    if (!sharded) return OkStatus();
    return folder->Add(r);
  };
  ShardWriter writer(tok.vocab_size(),
                     sharded ? std::min(o.shard_tokens, kMaxLlmcTokens) : kMaxLlmcTokens, name,
                     on_shard, static_cast<int>(resumed));

  // The pipeline: this thread reads and writes, `threads` workers encode; at most `window`
  // chunks are in flight (read, not yet written), which bounds the memory.
  const uint64_t window = static_cast<uint64_t>(2 * threads + 2);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Chunk*> todo;
  std::map<uint64_t, std::unique_ptr<Chunk>> done;
  bool stop = false;
  auto worker = [&] {
    TokenizerEncoder encoder(&tok);
    for (;;) {
      Chunk* c;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !todo.empty(); });
        if (todo.empty()) return;
        c = todo.front();
        todo.pop_front();
      }
      EncodeChunk(c, files[c->at.file], o.field, eot, &encoder);
      std::string().swap(c->bytes);
      {
        std::lock_guard<std::mutex> lock(mu);
        done[c->seq].reset(c);
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  auto shutdown = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
      for (Chunk* c : todo) delete c;
      todo.clear();
    }
    cv.notify_all();
    for (std::thread& t : pool) t.join();
  };

  const bool terminal = isatty(STDERR_FILENO) != 0;
  const int64_t start_bytes = file_base[start.file] + start.offset;
  Progress progress(!o.quiet, terminal, file_base.back(), start_bytes);
  ChunkReader reader(files, tok, o.chunk_bytes, start);
  uint64_t next_read = 0, next_write = 0;
  bool reader_done = false;
  Status failure;
  InputPosition end_of_last;  // where the chunk last written started
  bool emitted_before_last = emitted;
  std::vector<int32_t> out;
  while (failure.ok()) {
    // Fill the window.
    while (!reader_done && next_read - next_write < window) {
      auto c = std::make_unique<Chunk>(reader.Next());
      c->seq = next_read++;
      if (c->eof || !c->error.ok()) {
        reader_done = true;
        std::lock_guard<std::mutex> lock(mu);
        done[c->seq] = std::move(c);
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        todo.push_back(c.release());
      }
      cv.notify_one();
    }
    // Write the next chunk in order.
    std::unique_ptr<Chunk> c;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done.count(next_write) > 0; });
      auto it = done.find(next_write);
      c = std::move(it->second);
      done.erase(it);
    }
    ++next_write;
    if (!c->error.ok()) {
      failure = c->error;
      break;
    }
    if (c->eof) break;
    // The chunk's output: the end-of-text token first when it starts a document after another.
    out.clear();
    const bool before = emitted;
    if (c->has_doc && c->starts_doc && emitted) {
      if (eot < 0) {
        failure = NoEndOfTextError("documents");
        break;
      }
      out.push_back(eot);
    }
    if (c->has_doc) emitted = true;
    out.insert(out.end(), c->ids.begin(), c->ids.end());
    const int64_t from = std::min<int64_t>(skip, static_cast<int64_t>(out.size()));
    skip = 0;
    const ShardEnd chunk_start{c->at, 0, before};
    failure =
        writer.Write(out.data() + from, static_cast<int64_t>(out.size()) - from, chunk_start, from);
    end_of_last = c->at;
    emitted_before_last = before;
    progress.Update(file_base[c->at.file] + c->at.offset + c->length,
                    done_tokens + writer.written(), writer.shards());
  }
  shutdown();
  if (failure.ok() && done_tokens + writer.written() == 0) {
    failure = InvalidArgumentError(files.front().path +
                                   ": the text gives no tokens (hint: give non-empty text)");
  }
  if (failure.ok()) {
    ShardEnd last{end_of_last, 0, emitted_before_last};
    last.skip = static_cast<int64_t>(out.size());  // the whole of the last chunk
    failure = writer.Finish(last);
  }
  if (failure.ok() && !sharded && writer.shards() > 1) {
    std::error_code ec;
    fs::remove(o.output, ec);
    failure = InvalidArgumentError(
        o.output + ": over " + std::to_string(kMaxLlmcTokens) +
        " tokens do not fit the llm.c header's int32 count (hint: write shards with "
        "--shard-tokens N and -o FOLDER)");
  }
  if (failure.ok() && sharded) failure = folder->WriteManifest(true);
  if (!failure.ok()) {
    std::fprintf(stderr, "%s", terminal && !o.quiet ? "\n" : "");
    return ReportError(failure);
  }
  progress.Update(file_base.back(), done_tokens + writer.written(), writer.shards(), true);
  summary(done_tokens + writer.written());
  return kExitOk;
}

}  // namespace

void RegisterTokenizeCommand(CLI::App& app, CommandResult& result) {
  auto o = std::make_shared<TokenizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize text and JSONL files, folders or globs with a Hugging Face tokenizer into llm.c "
      ".bin token files");
  cmd->add_option("--tokenizer", o->tokenizer, "a folder holding tokenizer.json")->required();
  cmd->add_option("inputs", o->inputs,
                  "text or .jsonl files, folders of them, or globs (read in the given order)")
      ->required();
  cmd->add_option("-o,--output", o->output,
                  "the llm.c token file to write, or with --shard-tokens the folder of shards")
      ->required();
  cmd->add_option("--shard-tokens", o->shard_tokens,
                  "write shards of N tokens each (PREFIX_000000.bin, …) and manifest.json into "
                  "the -o folder; resumable")
      ->check(CLI::Range(int64_t{1}, kMaxLlmcTokens));
  cmd->add_option("--prefix", o->prefix, "the shards' file name prefix (default shard)")
      ->check([](const std::string& p) {
        return p.empty() || p[0] == '.' || p.find('/') != std::string::npos
                   ? std::string("a file name without '/' that does not start with '.'")
                   : std::string();
      });
  cmd->add_option("--field", o->field, "the text field of JSONL records (default text)");
  cmd->add_option("--threads", o->threads, "encoding threads (0: the cores this process may use)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--chunk-bytes", o->chunk_bytes,
                  "bytes per unit of work (default 1048576; changes no id)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_flag("-q,--quiet", o->quiet, "no progress");
  cmd->add_option("--template", o->chat_template,
                  "render prompt/completion and messages records with this template (as "
                  "data.template; default the tokenizer's chat template) and write OUT.mask");
  cmd->add_flag("--masks", o->masks,
                "write OUT.mask (completion tokens, sample starts) beside OUT.bin");
  cmd->add_option("--seq-len", o->seq_len,
                  "lay samples out in training windows of N tokens (model.seq_len), one per "
                  "window")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_flag("--pack", o->pack, "with --seq-len: pack short samples into windows");
  cmd->callback([o, &result] { result.run = [o] { return RunTokenize(*o); }; });
}

}  // namespace meshrun::client
