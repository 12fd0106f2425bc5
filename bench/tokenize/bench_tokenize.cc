// Tokenizer throughput: meshrun's byte-level BPE (engine/data/tokenizer.h) beside the
// `tokenizers` library on the same documents with the same tokenizer.json, on one core and on
// all cores (meshrun: threads over documents; tokenizers: encode_batch on its Rayon pool), MB/s
// of UTF-8 input, with a "same ids" column (count and hash of every id against the library's).
// Prints a table and one JSON line.
//
//   bench_tokenize [--text PATH] [--tokenizer DIR]… [-n iters] [-t threads] [--venv DIR]
//                  [--no-hf]
//
// --text: a text file or folder (default: the fortunes, /usr/share/games/fortunes), cut into
// documents at fortune separators ("\n%\n"). Without --tokenizer, the library trains a GPT-2-
// style (ByteLevel regex) and a Llama-3-style (Split regex + ByteLevel) tokenizer of 8,192 ids on
// those documents first (bench/tokenize/tokenize_hf.py, with DIR/bin/python; DIR defaults to the
// build's model-venv, made by tests/python/make-venv). Times are the best of -n runs; meshrun's
// encoders start cold each run (a fresh pre-token cache), the library's tokenizer is reused.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/data/token_stream.h"
#include "engine/data/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Options {
  std::string text = "/usr/share/games/fortunes";
  std::vector<std::string> tokenizers;
  int iters = 3, threads = 0;
  std::string venv = MESHRUN_BENCH_MODEL_VENV;
  bool hf = true;
};

struct Run {
  double seconds = 0;
  size_t tokens = 0;
  uint64_t hash = 0;
};

// The documents: each file cut at fortune separators.
std::vector<std::string> Documents(const std::string& path) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> skipped;
    if (!meshrun::ListTextFolderForTokens(path, &files, &skipped).ok()) return {};
  } else {
    files.push_back(path);
  }
  std::vector<std::string> docs;
  for (const std::string& f : files) {
    std::string bytes;
    if (!meshrun::ReadTextFile(f, &bytes).ok() || !meshrun::IsUtf8Text(bytes)) continue;
    size_t start = 0;
    while (start < bytes.size()) {
      size_t end = bytes.find("\n%\n", start);
      end = end == std::string::npos ? bytes.size() : end + 3;
      docs.push_back(bytes.substr(start, end - start));
      start = end;
    }
  }
  return docs;
}

Run Meshrun(const meshrun::Tokenizer& tok, const std::vector<std::string>& docs, int threads,
            int iters) {
  Run best;
  best.seconds = 1e30;
  for (int it = 0; it < iters; ++it) {
    std::vector<std::vector<int32_t>> ids(docs.size());
    std::atomic<size_t> next{0};
    const auto start = std::chrono::steady_clock::now();
    auto work = [&] {
      meshrun::TokenizerEncoder encoder(&tok);
      for (size_t i = next++; i < docs.size(); i = next++) {
        if (!encoder.Encode(docs[i], &ids[i]).ok()) std::abort();
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s < best.seconds) {
      best.seconds = s;
      best.tokens = 0;
      best.hash = 0;
      uint64_t power = 1;
      for (const auto& v : ids) {
        for (int32_t id : v) {
          best.hash += static_cast<uint64_t>(id) * power;  // as tokenize_hf.py's ids_hash
          power *= 1000003ull;
          ++best.tokens;
        }
      }
    }
  }
  return best;
}

bool Python(const Options& o, const std::string& args, std::string* out) {
  const std::string python = o.venv + "/bin/python";
  if (access(python.c_str(), X_OK) != 0) return false;
  const std::string cmd =
      python + " " MESHRUN_BENCH_SOURCE_DIR "/bench/tokenize/tokenize_hf.py " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return false;
  char buf[4096];
  out->clear();
  while (fgets(buf, sizeof(buf), p) != nullptr) *out += buf;
  return pclose(p) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s: needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--text") {
      o.text = value();
    } else if (a == "--tokenizer") {
      o.tokenizers.push_back(value());
    } else if (a == "-n") {
      o.iters = std::max(1, std::atoi(value().c_str()));
    } else if (a == "-t") {
      o.threads = std::atoi(value().c_str());
    } else if (a == "--venv") {
      o.venv = value();
    } else if (a == "--no-hf") {
      o.hf = false;
    } else {
      std::fprintf(stderr,
                   "usage: bench_tokenize [--text PATH] [--tokenizer DIR]... [-n iters] "
                   "[-t threads] [--venv DIR] [--no-hf]\n");
      return 2;
    }
  }
  const int all = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  const std::vector<std::string> docs = Documents(o.text);
  double mb = 0;
  for (const std::string& d : docs) mb += d.size() / 1e6;
  if (docs.empty()) {
    std::fprintf(stderr,
                 "error: --text: no UTF-8 text in %s (hint: scripts/setup installs the "
                 "fortunes, or pass --text FILE)\n",
                 o.text.c_str());
    return 2;
  }
  const fs::path work =
      fs::temp_directory_path() / ("meshrun-bench-tokenize-" + std::to_string(getpid()));
  fs::create_directories(work);
  const std::string docs_json = (work / "docs.json").string();
  std::ofstream(docs_json) << json(docs).dump();
  std::string out;
  if (o.tokenizers.empty()) {
    if (!Python(o, "train " + work.string() + " " + docs_json, &out)) {
      std::fprintf(stderr,
                   "error: --tokenizer: none given, and %s/bin/python could not train "
                   "one (hint: tests/python/make-venv %s "
                   "tests/python/requirements-models.txt, or pass --tokenizer DIR)\n",
                   o.venv.c_str(), o.venv.c_str());
      fs::remove_all(work);
      return 1;
    }
    o.tokenizers = {(work / "gpt2").string(), (work / "llama3").string()};
  }

  std::printf(
      "bench_tokenize: %zu documents, %.2f MB of UTF-8 from %s; best of %d; %d threads "
      "for \"all\"\n",
      docs.size(), mb, o.text.c_str(), o.iters, all);
  std::printf("%-10s %7s %9s %14s %14s %8s %9s\n", "tokenizer", "threads", "tokens", "meshrun MB/s",
              "tokenizers MB/s", "speedup", "same ids");
  json rows = json::array();
  for (const std::string& dir : o.tokenizers) {
    auto tok = meshrun::Tokenizer::Load(dir);
    if (!tok.ok()) {
      std::fprintf(stderr, "error: %s\n", tok.status().message().c_str());
      fs::remove_all(work);
      return 2;
    }
    const std::string name = fs::path(dir).filename().string();
    for (int threads : {1, all}) {
      const Run m = Meshrun(**tok, docs, threads, o.iters);
      double hf_mbs = 0;
      std::string same = "-";
      if (o.hf) {
        const std::string env = "RAYON_NUM_THREADS=" + std::to_string(threads) + " ";
        std::string line;
        setenv("RAYON_NUM_THREADS", std::to_string(threads).c_str(), 1);
        if (Python(
                o,
                "measure " + dir + "/tokenizer.json " + docs_json + " " + std::to_string(o.iters),
                &line)) {
          const json r = json::parse(line, nullptr, false);
          if (r.is_object()) {
            hf_mbs = mb / r["seconds"].get<double>();
            same = (r["tokens"].get<size_t>() == m.tokens &&
                    r["hash"].get<std::string>() == std::to_string(m.hash))
                       ? "yes"
                       : "NO";
          }
        }
      }
      const double m_mbs = mb / m.seconds;
      std::printf("%-10s %7d %9zu %14.2f %14.2f %7.2fx %9s\n", name.c_str(), threads, m.tokens,
                  m_mbs, hf_mbs, hf_mbs > 0 ? m_mbs / hf_mbs : 0.0, same.c_str());
      rows.push_back({{"tokenizer", name},
                      {"threads", threads},
                      {"tokens", m.tokens},
                      {"meshrun_mb_per_s", m_mbs},
                      {"tokenizers_mb_per_s", hf_mbs},
                      {"same_ids", same}});
      if (threads == all) break;  // one row when all is 1
    }
  }
  std::printf("%s\n",
              json({{"bench", "tokenize"}, {"mb", mb}, {"documents", docs.size()}, {"rows", rows}})
                  .dump()
                  .c_str());
  fs::remove_all(work);
  return 0;
}
