// Issue 31 "A user's first week": `meshrun validate` runs every check `train` runs before its
// first step (the same function, client/preflight.h), with exit 2 and one line naming the field:
// data shorter than one window, init_from folders of an unsupported model_type, without a
// required config.json key or with a missing shard, a checkpoint.dir whose newest checkpoint is
// of another model; `train` checks the model before it reads the data; the notes a valid spec
// gets (nothing saved without checkpoint.dir, lr 0). Real processes on the tiny example.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::CliResult;
using testing::Lines;
using testing::RunCli;

class FirstWeekTest : public meshrun::testing::MeshrunBinaryTest {
 protected:
  CliResult Run(const std::vector<std::string>& args) {
    return RunCli(binary_, args, temp_ / "stderr.txt", 120);
  }
  std::string Tiny() const { return (source_ / "examples/tiny.yaml").string(); }

  // `validate` (or `train`) of the tiny example with `sets` as --set overrides; checkpoint.dir
  // in the temp folder unless a set names it.
  CliResult Command(const std::string& command, std::vector<std::string> sets) {
    std::vector<std::string> args = {command, "-f", Tiny(), "--set",
                                     "checkpoint.dir=" + (temp_ / "none").string()};
    if (command == "train") {
      args.insert(args.end(), {"--nproc", "1", "-o", "json", "--set", "train.steps=1", "--set",
                               "train.warmup_steps=0"});
    }
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    return Run(args);
  }

  // Exit 2 and the first stderr line `error: FIELD: …` holding `contains` and a hint; returns it.
  static std::string ExpectInvalid(const CliResult& r, const std::string& field,
                                   const std::string& contains) {
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    const std::vector<std::string> lines = Lines(r.err);
    if (lines.empty()) {
      ADD_FAILURE() << "no stderr";
      return "";
    }
    const std::string& line = lines.back();
    EXPECT_EQ(line.rfind("error: " + field + ": ", 0), 0u) << r.err;
    EXPECT_NE(line.find(contains), std::string::npos) << line;
    EXPECT_NE(line.find("(hint: "), std::string::npos) << line;
    return line;
  }

  // A checkpoint of the tiny model (2 steps) under temp/ck, exported as a Hugging Face folder
  // temp/hf in shards of at most 200 kB (model.safetensors.index.json).
  void TrainAndExport() {
    const CliResult t = Command(
        "train", {"checkpoint.dir=" + (temp_ / "ck").string(), "train.steps=2", "data.val="});
    ASSERT_EQ(t.exit_code, 0) << t.err;
    const CliResult e = Run({"export", (temp_ / "ck").string(), "--output-dir",
                             (temp_ / "hf").string(), "--max-shard-size", "200KB"});
    ASSERT_EQ(e.exit_code, 0) << e.err;
    ASSERT_TRUE(fs::exists(temp_ / "hf" / "model.safetensors.index.json")) << e.out;
  }

  void WriteText(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }
};

TEST_F(FirstWeekTest, DataShorterThanOneWindowFailsValidateAsTrain) {
  WriteText(temp_ / "short.txt", "twenty bytes of text");
  const std::string short_data = "data.train=" + (temp_ / "short.txt").string();
  const std::string line = ExpectInvalid(Command("validate", {short_data}), "data.train",
                                         "20 tokens, fewer than one window of model.seq_len + 1");
  EXPECT_EQ(ExpectInvalid(Command("train", {short_data}), "data.train", "fewer than one window"),
            line);
  // data.val too: it would fail at the first evaluation, in the middle of training.
  ExpectInvalid(Command("validate", {"data.val=" + (temp_ / "short.txt").string()}), "data.val",
                "fewer than one window");
}

TEST_F(FirstWeekTest, InitFromFolderIsCheckedAsTrainLoadsIt) {
  TrainAndExport();
  const std::string hf = (temp_ / "hf").string();
  const CliResult ok = Command("validate", {"model.init_from=" + hf});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;

  // A shard the index lists is missing: the field, the file and the hint (train: the same line,
  // not exit 1 from inside the rank).
  fs::path shard;
  for (const auto& entry : fs::directory_iterator(hf)) {
    if (entry.path().filename().string().rfind("model-00002-of-", 0) == 0) shard = entry.path();
  }
  ASSERT_FALSE(shard.empty());
  fs::rename(shard, temp_ / "moved.safetensors");
  const std::string line = ExpectInvalid(Command("validate", {"model.init_from=" + hf}),
                                         "model.init_from", shard.filename().string());
  EXPECT_NE(line.find("model.safetensors.index.json lists"), std::string::npos) << line;
  EXPECT_EQ(ExpectInvalid(Command("train", {"model.init_from=" + hf}), "model.init_from",
                          shard.filename().string()),
            line);
  fs::rename(temp_ / "moved.safetensors", shard);

  // A model_type meshrun does not build: no invented GPT-2 spec on stdout.
  json config = json::parse(testing::ReadFile(fs::path(hf) / "config.json"));
  config["model_type"] = "bert";
  WriteText(fs::path(hf) / "config.json", config.dump());
  const CliResult bert = Command("validate", {"model.init_from=" + hf});
  ExpectInvalid(bert, "model.init_from", "model_type 'bert' is not one meshrun builds");
  EXPECT_EQ(bert.out, "");

  // A llama config.json without hidden_size: not the default d_model 64.
  WriteText(fs::path(hf) / "config.json", json({{"model_type", "llama"},
                                                {"num_hidden_layers", 2},
                                                {"num_attention_heads", 4},
                                                {"intermediate_size", 256},
                                                {"vocab_size", 256},
                                                {"max_position_embeddings", 64}})
                                              .dump());
  const CliResult llama = Command("validate", {"model.init_from=" + hf});
  ExpectInvalid(llama, "model.init_from", "has no 'hidden_size'");
  EXPECT_EQ(llama.out, "");
}

TEST_F(FirstWeekTest, TrainChecksTheModelBeforeTheData) {
  fs::create_directories(temp_ / "bert");
  WriteText(temp_ / "bert" / "config.json", R"({"model_type": "bert"})");
  WriteText(temp_ / "bert" / "model.safetensors", "");
  // The data is missing too: the model is what train reports, before reading (or tokenizing)
  // any data.
  const CliResult r = Command("train", {"model.init_from=" + (temp_ / "bert").string(),
                                        "data.train=" + (temp_ / "no-such-data").string()});
  ExpectInvalid(r, "model.init_from", "model_type 'bert'");
}

TEST_F(FirstWeekTest, CheckpointOfAnotherModelFailsValidateAsTrain) {
  const CliResult t = Command("train", {"checkpoint.dir=" + (temp_ / "ck").string(), "data.val="});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const std::string ck = "checkpoint.dir=" + (temp_ / "ck").string();
  const std::string line = ExpectInvalid(Command("validate", {ck, "model.d_model=128"}),
                                         "checkpoint.dir", "does not fit this model's config");
  EXPECT_NE(line.find("checkpoint.dir=ANOTHER_DIR"), std::string::npos) << line;
  EXPECT_EQ(ExpectInvalid(Command("train", {ck, "model.d_model=128"}), "checkpoint.dir",
                          "does not fit this model's config"),
            line);
  // Without resuming there is nothing to fit.
  const CliResult never = Command("validate", {ck, "model.d_model=128", "checkpoint.resume=never"});
  EXPECT_EQ(never.exit_code, 0) << never.err;
}

TEST_F(FirstWeekTest, ValidSpecsSayWhatTheyWillNotDo) {
  // The two-line minimal spec: it trains, and saves nothing; validate and train say so.
  WriteText(temp_ / "minimal.yaml", "data:\n  train: /usr/share/games/fortunes/cookie\n");
  const std::string minimal = (temp_ / "minimal.yaml").string();
  const CliResult v = Run({"validate", "-f", minimal});
  ASSERT_EQ(v.exit_code, 0) << v.err;
  EXPECT_NE(v.err.find("note: checkpoint.dir is not set, so this run saves nothing"),
            std::string::npos)
      << v.err;
  EXPECT_NE(v.err.find("(hint: set checkpoint.dir"), std::string::npos) << v.err;
  const CliResult t = Run({"train", "-f", minimal, "-o", "json", "--set", "train.steps=1", "--set",
                           "train.warmup_steps=0"});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.err.find("note: checkpoint.dir is not set"), std::string::npos) << t.err;
  // A spec with a checkpoint.dir gets no such note.
  const CliResult tiny = Command("validate", {});
  ASSERT_EQ(tiny.exit_code, 0) << tiny.err;
  EXPECT_EQ(tiny.err, "");

  // lr 0 trains nothing: a warning (it is how init_from weights become a checkpoint unchanged).
  const CliResult lr0 = Command("validate", {"train.lr=0", "train.min_lr=0"});
  ASSERT_EQ(lr0.exit_code, 0) << lr0.err;
  EXPECT_NE(lr0.err.find("warning: train.lr: 0 leaves the weights as they start"),
            std::string::npos)
      << lr0.err;
}

}  // namespace
}  // namespace meshrun
