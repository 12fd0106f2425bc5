// Keeps docs/checkpoints.md's "## Export" section (and the `--dtype` row of docs/cli.md's export
// entry) honest against what `meshrun export` writes (issue 39): a one-step GPT-2 is trained and
// exported; every file export writes (one safetensors file, or shards with their index) is named
// in the section, and every `DIR/…` file the section names is one export writes; every key of
// config.json and every tensor (its module path) is named; the dtype values the docs list are
// exactly the ones `meshrun export --help` accepts, and each writes the dtype it says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::ReadFile;
using testing::RunCli;

// The tensors' names and dtypes of a safetensors file (its JSON header).
std::map<std::string, std::string> ExportDocTensorDtypes(const fs::path& file) {
  std::map<std::string, std::string> out;
  std::ifstream in(file, std::ios::binary);
  uint64_t size = 0;
  in.read(reinterpret_cast<char*>(&size), 8);
  if (!in || size > (1u << 24)) return out;
  std::string header(size, '\0');
  in.read(header.data(), static_cast<std::streamsize>(size));
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, false);
  if (!j.is_object()) return out;
  for (const auto& [name, info] : j.items()) {
    if (name != "__metadata__") out[name] = info.value("dtype", "");
  }
  return out;
}

std::set<std::string> FilesIn(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// The dtype values written in backticks in `text` that are among `known` (aliases included).
std::set<std::string> DtypeValuesNamedIn(const std::string& text,
                                         const std::set<std::string>& known) {
  std::set<std::string> values;
  static const std::regex kTick("`([^`]*)`");
  for (std::sregex_iterator it(text.begin(), text.end(), kTick), end; it != end; ++it) {
    std::string token = (*it)[1];
    if (token.rfind("--dtype ", 0) == 0) token = token.substr(8);
    std::stringstream parts(token);
    for (std::string part; std::getline(parts, part, '|');) {
      if (known.count(part)) values.insert(part);
    }
  }
  return values;
}

class ExportDocTest : public testing::MeshrunBinaryTest {
 protected:
  void SetUp() override {
    testing::MeshrunBinaryTest::SetUp();
    const std::string doc = ReadFile(source_ / "docs" / "checkpoints.md");
    const size_t begin = doc.find("\n## Export\n");
    ASSERT_NE(begin, std::string::npos) << "docs/checkpoints.md has no ## Export section";
    const size_t end = doc.find("\n## ", begin + 4);
    section_ = doc.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    flat_ = std::regex_replace(section_, std::regex(R"(\s+)"), " ");
    // A one-step byte-level GPT-2 with a checkpoint.
    std::ofstream(temp_ / "corpus.txt") << std::string(40, 'x') + "\n" + std::string(2000, 'a');
    std::ofstream(temp_ / "job.yaml")
        << "data: {train: " << (temp_ / "corpus.txt").string()
        << "}\ntrain: {steps: 1, warmup_steps: 0}\ncheckpoint: {dir: " << (temp_ / "ck").string()
        << "}\n";
    const CliResult r =
        RunCli(binary_, {"train", "-f", (temp_ / "job.yaml").string()}, temp_ / "train.err", 120);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  // `meshrun export ck -o DIR ARGS…`; the folder.
  fs::path Export(const std::string& name, std::vector<std::string> args) {
    const fs::path out = temp_ / name;
    std::vector<std::string> all = {"export", (temp_ / "ck").string(), "-o", out.string()};
    all.insert(all.end(), args.begin(), args.end());
    const CliResult r = RunCli(binary_, all, temp_ / "export.err", 60);
    EXPECT_EQ(r.exit_code, 0) << "meshrun export " << name << ": " << r.err;
    return out;
  }

  // `text` is in the section (line breaks read as spaces).
  bool Named(const std::string& text) const { return flat_.find(text) != std::string::npos; }

  std::string section_, flat_;
};

TEST_F(ExportDocTest, TheSectionNamesEveryFileKeyAndTensorExportWrites) {
  const fs::path single = Export("single", {});
  const fs::path sharded = Export("sharded", {"--max-shard-size", "20000"});
  std::set<std::string> written = FilesIn(single);
  const std::set<std::string> shard_files = FilesIn(sharded);
  ASSERT_GT(shard_files.size(), written.size()) << "--max-shard-size 20000 wrote no shards";
  written.insert(shard_files.begin(), shard_files.end());
  static const std::regex kShard(R"(^model-\d{5}-of-\d{5}\.safetensors$)");
  for (const std::string& file : written) {
    if (std::regex_match(file, kShard)) {
      if (file.rfind("model-00001-", 0) != 0) continue;  // one message for all shards
      EXPECT_TRUE(Named("model-0000K-of-0000N.safetensors"))
          << "export writes shards such as " << file
          << "; docs/checkpoints.md's Export section does not name them "
             "(model-0000K-of-0000N.safetensors)";
    } else {
      EXPECT_TRUE(Named("`DIR/" + file + "`") || Named("`" + file + "`"))
          << "export writes " << file << ", which docs/checkpoints.md's Export section does not "
          << "name";
    }
  }
  // Every DIR/… the section names is written (the tokenizer's files by a tokenizer job only).
  const std::set<std::string> tokenizer_files = {"tokenizer.json", "tokenizer_config.json",
                                                 "special_tokens_map.json"};
  static const std::regex kDirFile(R"(`DIR/([A-Za-z0-9_.{}-]+)`)");
  for (std::sregex_iterator it(section_.begin(), section_.end(), kDirFile), end; it != end; ++it) {
    const std::string file = (*it)[1];
    const bool shard_pattern =
        file == "model-0000K-of-0000N.safetensors" &&
        std::any_of(written.begin(), written.end(),
                    [](const std::string& w) { return std::regex_match(w, kShard); });
    EXPECT_TRUE(written.count(file) || tokenizer_files.count(file) || shard_pattern)
        << "docs/checkpoints.md's Export section names DIR/" << file
        << ", which meshrun export does not write";
  }
  // Every key of config.json.
  const nlohmann::json config =
      nlohmann::json::parse(ReadFile(single / "config.json"), nullptr, false);
  ASSERT_TRUE(config.is_object());
  for (const auto& [key, value] : config.items()) {
    EXPECT_TRUE(Named("`" + key)) << "export's config.json has " << key << " = " << value.dump()
                                  << ", which docs/checkpoints.md's Export section does not name";
  }
  // Every tensor, by its module path (`transformer.h.{i}.attn.c_attn.` for
  // transformer.h.0.attn.c_attn.weight).
  const auto tensors = ExportDocTensorDtypes(single / "model.safetensors");
  ASSERT_FALSE(tensors.empty());
  static const std::regex kLayer(R"(\.\d+\.)");
  for (const auto& [name, dtype] : tensors) {
    const std::string generic = std::regex_replace(name, kLayer, ".{i}.");
    const std::string module = generic.substr(0, generic.rfind('.') + 1);
    EXPECT_TRUE(Named("`" + module))
        << "export writes the tensor " << name << "; docs/checkpoints.md's Export section does "
        << "not name " << module << "*";
  }
  if (config.value("tie_word_embeddings", false)) {
    EXPECT_EQ(tensors.count("lm_head.weight"), 0u) << "a tied model exports no lm_head.weight";
  }
}

TEST_F(ExportDocTest, TheDtypesTheDocsListAreTheOnesExportTakesAndWrites) {
  // The choices of `meshrun export --help` (CLI11: "--dtype TEXT:{source,float32,…}").
  const CliResult help = RunCli(binary_, {"export", "--help"}, temp_ / "help.err");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(help.out, m, std::regex(R"(--dtype TEXT:\{([^}]*)\})")))
      << help.out;
  std::set<std::string> choices;
  std::stringstream list(m[1].str());
  for (std::string c; std::getline(list, c, ',');) choices.insert(c);
  ASSERT_TRUE(choices.count("source")) << help.out;

  const size_t dtype = section_.find("**Dtype.**");
  ASSERT_NE(dtype, std::string::npos) << "docs/checkpoints.md's Export section has no **Dtype.**";
  const std::string paragraph = section_.substr(dtype, section_.find("\n\n", dtype) - dtype);
  EXPECT_EQ(DtypeValuesNamedIn(paragraph, choices), choices)
      << "docs/checkpoints.md's **Dtype.** paragraph lists other dtypes than meshrun export "
         "--help accepts: "
      << paragraph;
  const std::string cli = ReadFile(source_ / "docs" / "cli.md");
  const size_t row = cli.find("| `--dtype D` |");
  ASSERT_NE(row, std::string::npos) << "docs/cli.md's export entry has no `--dtype D` row";
  EXPECT_EQ(DtypeValuesNamedIn(cli.substr(row, cli.find('\n', row) - row), choices), choices)
      << "docs/cli.md's --dtype row lists other dtypes than meshrun export --help accepts";

  // Each writes what it names: config.json's torch_dtype and the tensors' dtype agree; source
  // is float32 for a model trained from scratch, as the paragraph says.
  const std::map<std::string, std::pair<std::string, std::string>> expect = {
      {"source", {"float32", "F32"}}, {"float32", {"float32", "F32"}},
      {"fp32", {"float32", "F32"}},   {"bfloat16", {"bfloat16", "BF16"}},
      {"bf16", {"bfloat16", "BF16"}}, {"float16", {"float16", "F16"}},
      {"fp16", {"float16", "F16"}}};
  for (const std::string& choice : choices) {
    const auto want = expect.find(choice);
    ASSERT_NE(want, expect.end()) << "a dtype this test does not know: " << choice;
    const fs::path out = Export("dtype-" + choice, {"--dtype", choice});
    const nlohmann::json config =
        nlohmann::json::parse(ReadFile(out / "config.json"), nullptr, false);
    EXPECT_EQ(config.value("torch_dtype", ""), want->second.first) << "--dtype " << choice;
    for (const auto& [name, got] : ExportDocTensorDtypes(out / "model.safetensors")) {
      EXPECT_EQ(got, want->second.second) << "--dtype " << choice << ": " << name;
    }
  }
  EXPECT_TRUE(Named("float32 for a model trained from scratch"));
}

}  // namespace
}  // namespace meshrun
