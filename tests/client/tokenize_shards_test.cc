// `meshrun tokenize` at scale (docs/data.md "Making token files"), run as a real process: the ids
// of a folder of text files and of JSONL files are those TokenizeTexts (what data.train reads)
// gives, for several thread counts, chunk sizes that cut documents (Tokenizer::SafeCut) and shard
// sizes that cut documents; each shard is a valid llm.c file and the manifest's CRC-32s are the
// files'; a run killed with SIGKILL after its first shard and run again gives the same files byte
// for byte; a damaged shard is written again; a JSONL record without the field is an error naming
// the file and the line.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32.h"
#include "common/dir_lock.h"
#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"
#include "tests/client/cli_runner.h"
#include "tests/fakes/byte_level.h"

namespace meshrun {
namespace {

using testing::ByteLevelChar;

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::meshrun::testing::ReadFile;
using ::meshrun::testing::RunCli;

constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Bytes, merges that make whole words and a newline pair, and <|endoftext|>.
json TestTokenizer(const json& pre) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(b)] = b;
  const std::string sp = ByteLevelChar(' '), nl = ByteLevelChar('\n');
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"th", "e"},      {sp, "the"}, {"a", "n"}, {"an", "d"}, {sp, "and"}, {"o", "r"},
      {sp, "w"},  {sp + "w", "or"}, {nl, nl},    {"i", "n"}, {"in", "g"}, {".", nl},   {sp, sp}};
  json m = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    if (vocab.contains(a + b)) continue;
    m.push_back(a + " " + b);
    vocab[a + b] = id++;
  }
  json added = json::array();
  added.push_back({{"id", id}, {"content", "<|endoftext|>"}, {"special", true}});
  return {{"version", "1.0"},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"added_tokens", added},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

// Text with every kind of whitespace run around newlines, punctuation, digits, contractions,
// non-ASCII letters and the end-of-text token written in the text.
std::string RandomText(std::mt19937& rng, size_t bytes) {
  static const std::vector<std::string> words = {
      "the",  "and",   "world",         "thing", "it's", "we'll", "42", "12345",
      "café", "naïve", "日本語",        "ok.",   "end!", "(x)",   "--", "\"q\"",
      "a",    "I",     "<|endoftext|>", "don't", "x_y",  "#1"};
  static const std::vector<std::string> gaps = {" ",  " ",    " ",   " ",      "\n",
                                                "\n", "\n\n", " \n", "\n ",    "  ",
                                                "\t", "\r\n", ".\n", "\n\n\n", ", "};
  std::string out;
  while (out.size() < bytes) {
    out += words[rng() % words.size()];
    out += gaps[rng() % gaps.size()];
  }
  return out;
}

std::vector<int32_t> ReadLlmc(const fs::path& path) {
  StatusOr<TokenStream> s = LoadLlmcFile(path.string());
  EXPECT_TRUE(s.ok()) << path << ": " << s.status().message();
  return s.ok() ? s->tokens : std::vector<int32_t>();
}

class TokenizeShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* b = std::getenv("MESHRUN_BINARY_DIR");
    meshrun_ = fs::path(b != nullptr ? b : "build") / "bin" / "meshrun";
    ASSERT_TRUE(fs::exists(meshrun_)) << meshrun_;
    dir_ = fs::temp_directory_path() / ("tokenize-shards-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const json gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
    const json llama3 = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kLlama3}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    for (const auto& [name, pre] : {std::pair{"gpt2", gpt2}, std::pair{"llama3", llama3}}) {
      fs::create_directories(dir_ / name);
      std::ofstream(dir_ / name / "tokenizer.json") << TestTokenizer(pre).dump();
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::shared_ptr<const Tokenizer> Load(const std::string& name) {
    auto t = Tokenizer::Load((dir_ / name).string());
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? *t : nullptr;
  }

  testing::CliResult Tokenize(std::vector<std::string> args) {
    args.insert(args.begin(), "tokenize");
    return RunCli(meshrun_, args, dir_ / "stderr.txt", 120);
  }

  // The shards of `out` in name order, joined, after checking each against the manifest.
  std::vector<int32_t> Shards(const fs::path& out, int64_t shard_tokens) {
    const json m = json::parse(ReadFile(out / "manifest.json"));
    EXPECT_TRUE(m.value("complete", false));
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(out)) {
      if (e.path().extension() == ".bin") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    EXPECT_EQ(files.size(), m["shards"].size());
    std::vector<int32_t> all;
    for (size_t i = 0; i < files.size() && i < m["shards"].size(); ++i) {
      const json& s = m["shards"][i];
      EXPECT_EQ(s["file"], files[i].filename().string());
      const std::vector<int32_t> ids = ReadLlmc(files[i]);
      EXPECT_EQ(static_cast<int64_t>(ids.size()), s["tokens"].get<int64_t>());
      if (i + 1 < files.size()) {
        EXPECT_EQ(static_cast<int64_t>(ids.size()), shard_tokens);
      }
      StatusOr<FileDigest> d = DigestFile(files[i].string());
      EXPECT_TRUE(d.ok());
      if (!d.ok()) continue;
      char hex[9];
      std::snprintf(hex, sizeof(hex), "%08x", d->crc32);
      EXPECT_EQ(s["crc32"], hex) << files[i];
      all.insert(all.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(static_cast<int64_t>(all.size()), m["tokens"].get<int64_t>());
    return all;
  }

  fs::path meshrun_, dir_;
};

TEST_F(TokenizeShardsTest, FolderIdsAreTodaysForEveryThreadCountChunkAndShardSize) {
  std::mt19937 rng(7);
  fs::create_directories(dir_ / "text");
  for (int f = 0; f < 5; ++f) {
    std::ofstream(dir_ / "text" / ("doc" + std::to_string(f) + ".txt"), std::ios::binary)
        << RandomText(rng, 20000 + 7000 * f);
  }
  std::ofstream(dir_ / "text" / "index.dat", std::ios::binary) << std::string("\xff\x01\x02", 3);
  for (const std::string tok : {"gpt2", "llama3"}) {
    // Today's ids: the whole files encoded as data.train reads them.
    StatusOr<TokenStream> want = TokenizeTexts({(dir_ / "text").string()}, Load(tok), {});
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_GT(want->tokens.size(), 10000u);
    // (threads, chunk bytes): whole files on one thread, a cut at nearly every safe place, and
    // a few lines per chunk.
    for (const auto& [threads, chunk] :
         {std::pair{1, 1 << 20}, std::pair{2, 7}, std::pair{3, 300}}) {
      {
        SCOPED_TRACE(tok + " threads " + std::to_string(threads) + " chunk " +
                     std::to_string(chunk));
        const fs::path one = dir_ / "one.bin";
        testing::CliResult r = Tokenize(
            {"--tokenizer", (dir_ / tok).string(), (dir_ / "text").string(), "-o", one.string(),
             "--threads", std::to_string(threads), "--chunk-bytes", std::to_string(chunk), "-q"});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(ReadLlmc(one), want->tokens);
        for (const int64_t shard : {997, 100000}) {
          const fs::path out = dir_ / ("out-" + std::to_string(shard));
          fs::remove_all(out);
          r = Tokenize({"--tokenizer", (dir_ / tok).string(), (dir_ / "text").string(), "-o",
                        out.string(), "--shard-tokens", std::to_string(shard), "--threads",
                        std::to_string(threads), "--chunk-bytes", std::to_string(chunk), "-q"});
          ASSERT_EQ(r.exit_code, 0) << r.err;
          EXPECT_EQ(Shards(out, shard), want->tokens);
        }
      }
    }
  }
}

TEST_F(TokenizeShardsTest, JsonlRecordsAreDocumentsJoinedByEndOfText) {
  std::mt19937 rng(11);
  fs::create_directories(dir_ / "jsonl");
  std::vector<std::string> docs;
  for (int f = 0; f < 3; ++f) {
    std::ofstream out(dir_ / "jsonl" / ("part" + std::to_string(f) + ".jsonl"), std::ios::binary);
    for (int r = 0; r < 60; ++r) {
      std::string text = r % 17 == 5 ? std::string() : RandomText(rng, rng() % 1500);
      out << json{{"id", r}, {"body", text}, {"meta", {{"x", 1}}}}.dump() << "\n";
      if (r % 13 == 0) out << "\n";  // a blank line is no record
      if (!text.empty()) docs.push_back(text);
    }
  }
  for (const std::string tok : {"gpt2", "llama3"}) {
    auto t = Load(tok);
    std::vector<int32_t> want;
    for (size_t i = 0; i < docs.size(); ++i) {
      if (i > 0) want.push_back(t->end_of_text_id());
      StatusOr<std::vector<int32_t>> ids = t->Encode(docs[i]);
      ASSERT_TRUE(ids.ok());
      want.insert(want.end(), ids->begin(), ids->end());
    }
    for (const auto& [threads, chunk] : {std::pair{1, 1}, std::pair{3, 5000}}) {
      {
        SCOPED_TRACE(tok + " threads " + std::to_string(threads) + " chunk " +
                     std::to_string(chunk));
        const fs::path out = dir_ / "out";
        fs::remove_all(out);
        testing::CliResult r =
            Tokenize({"--tokenizer", (dir_ / tok).string(), (dir_ / "jsonl" / "*.jsonl").string(),
                      "-o", out.string(), "--field", "body", "--shard-tokens", "1234", "--threads",
                      std::to_string(threads), "--chunk-bytes", std::to_string(chunk), "-q"});
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_EQ(Shards(out, 1234), want);
      }
    }
  }
  // Without --field the records have no "text": exit 2 naming the file and the line.
  testing::CliResult r = Tokenize({"--tokenizer", (dir_ / "gpt2").string(),
                                   (dir_ / "jsonl").string(), "-o", (dir_ / "x.bin").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("error: " + (dir_ / "jsonl" / "part0.jsonl").string() +
                       ":1: the record has no \"text\" field (hint: name the text field with "
                       "--field NAME)"),
            std::string::npos)
      << r.err;
  // A malformed line further on names its line too.
  std::ofstream(dir_ / "jsonl" / "part2.jsonl", std::ios::app) << "{\"body\": \"a\"}\nnot json\n";
  r = Tokenize({"--tokenizer", (dir_ / "gpt2").string(), (dir_ / "jsonl").string(), "--field",
                "body", "-o", (dir_ / "x.bin").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find((dir_ / "jsonl" / "part2.jsonl").string() + ":" +
                       std::to_string(60 + 5 + 2) + ": not a JSON object"),
            std::string::npos)
      << r.err;
}

// Starts `meshrun tokenize ARGS` in the background; its pid.
pid_t Spawn(const fs::path& binary, const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    std::string b = binary.string();
    argv.push_back(b.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(b.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

TEST_F(TokenizeShardsTest, KilledMidWayAndRunAgainGivesTheSameFiles) {
  std::mt19937 rng(std::random_device{}());
  fs::create_directories(dir_ / "big");
  for (int f = 0; f < 4; ++f) {
    std::ofstream(dir_ / "big" / ("t" + std::to_string(f) + ".txt"), std::ios::binary)
        << RandomText(rng, 400000);
  }
  const std::vector<std::string> common = {"--tokenizer",
                                           (dir_ / "llama3").string(),
                                           (dir_ / "big").string(),
                                           "--shard-tokens",
                                           "5000",
                                           "--chunk-bytes",
                                           "4000",
                                           "-q"};
  auto args = [&](const fs::path& out, int threads) {
    std::vector<std::string> a = {"tokenize"};
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), {"-o", out.string(), "--threads", std::to_string(threads)});
    return a;
  };
  // The uninterrupted run.
  const fs::path ref = dir_ / "ref";
  std::vector<std::string> a = args(ref, 2);
  testing::CliResult r = RunCli(meshrun_, a, dir_ / "stderr.txt", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<int32_t> ids = Shards(ref, 5000);
  ASSERT_GT(ids.size(), 50000u);

  int killed_mid_way = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const fs::path out = dir_ / ("run" + std::to_string(attempt));
    const pid_t pid = Spawn(meshrun_, args(out, 1));
    ASSERT_GT(pid, 0);
    // Wait (bounded) for the first complete shard in the manifest, then a random moment more.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool first = false;
    while (!first && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::error_code ec;
      if (!fs::exists(out / "manifest.json", ec)) continue;
      const json m = json::parse(ReadFile(out / "manifest.json"), nullptr, false);
      first = !m.is_discarded() && m.contains("shards") && !m["shards"].empty();
    }
    ASSERT_TRUE(first) << "no shard within 60 s";
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 150));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    const json m = json::parse(ReadFile(out / "manifest.json"), nullptr, false);
    const bool mid_way = WIFSIGNALED(status) && !m.value("complete", false);
    killed_mid_way += mid_way ? 1 : 0;
    // Run again (other thread counts): the same files, byte for byte, the done shards reused.
    r = RunCli(meshrun_, args(out, 1 + attempt % 3), dir_ / "stderr.txt", 120);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (mid_way) {
      EXPECT_NE(r.err.find(" reused)"), std::string::npos) << r.err;
    }
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(ref)) names.push_back(e.path().filename());
    std::vector<std::string> got;
    for (const auto& e : fs::directory_iterator(out)) got.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, names);  // no partial shard or temporary left
    for (const std::string& n : names) {
      if (n == kDirLockFile) continue;  // who held the folder: this run's pid, not ref's
      EXPECT_EQ(ReadFile(out / n), ReadFile(ref / n)) << n << " (attempt " << attempt << ")";
    }
  }
  EXPECT_GT(killed_mid_way, 0) << "every run ended before its kill";

  // A damaged shard is noticed by its CRC-32 and written again; a finished folder is reused.
  const fs::path out = dir_ / "run0";
  {
    std::fstream f(out / "shard_000002.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2000);
    f.put('\x7f');
  }
  r = RunCli(meshrun_, args(out, 2), dir_ / "stderr.txt", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("shard_000002.bin: its CRC-32 or size is not the manifest's"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(Shards(out, 5000), ids);
  EXPECT_EQ(ReadFile(out / "manifest.json"), ReadFile(ref / "manifest.json"));
  // Another run's settings into the same folder: refused, nothing touched.
  a = args(out, 2);
  a[5] = "6000";  // --shard-tokens
  r = RunCli(meshrun_, a, dir_ / "stderr.txt", 120);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("manifest.json is of another run (its shard_tokens differ)"),
            std::string::npos)
      << r.err;
  // A second process on the folder while one runs: refused, naming the holder, nothing touched.
  {
    StatusOr<std::unique_ptr<DirLock>> held =
        DirLock::TryAcquire(out.string(), ThisProcess("meshrun tokenize"));
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    r = RunCli(meshrun_, args(out, 2), dir_ / "stderr.txt", 120);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("is in use by another run, pid " + std::to_string(getpid())),
              std::string::npos)
        << r.err;
  }
  EXPECT_EQ(Shards(out, 5000), ids);
  EXPECT_EQ(ReadFile(out / "manifest.json"), ReadFile(ref / "manifest.json"));
}

}  // namespace
}  // namespace meshrun
