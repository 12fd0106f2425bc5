// Weighted mixtures of data.train (docs/data.md "Mixtures") through `meshrun train --nproc N`:
// a 0.7/0.3 mixture trains to the same losses on one rank and on dp_shard 2 × tp 2; interrupted
// at step 3 under dp_shard 2 and resumed under dp_shard 2 × tp 2 or one rank, steps 4–6 have the
// uninterrupted run's losses; a resume whose sources or weights differ is refused. Real
// processes over Gloo on loopback, 6 steps of examples/tiny.yaml each.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"
#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kMixWeb = "/usr/share/games/fortunes/cookie";
// The second source is token shards: the bytes of this file as uint16 ids (the byte-level
// vocabulary), cut into three llm.c shards read through a glob (docs/data.md "Shards and memory"),
// so a mixture of a text file and sharded token files is what trains and resumes.
constexpr const char* kMixCodeText = "/usr/share/games/fortunes/computers";
std::string* mix_code_glob = nullptr;

std::string MixtureSet(double a, double b) {
  return std::string("data.train=[{path: ") + kMixWeb + ", weight: " + std::to_string(a) +
         "}, {path: " + *mix_code_glob + ", weight: " + std::to_string(b) + "}]";
}

// Writes `text`'s bytes as llm.c version-1 shards DIR/code_00000K.bin (three, unequal).
void WriteLlmcShards(const std::string& text, const fs::path& dir) {
  fs::create_directories(dir);
  const size_t cuts[4] = {0, text.size() / 5, text.size() / 2, text.size()};
  for (int k = 0; k < 3; ++k) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = static_cast<int32_t>(cuts[k + 1] - cuts[k]);
    std::vector<uint16_t> ids;
    for (size_t i = cuts[k]; i < cuts[k + 1]; ++i)
      ids.push_back(static_cast<unsigned char>(text[i]));
    std::ofstream out(dir / ("code_00000" + std::to_string(k) + ".bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
    out.write(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t));
  }
}

struct MixRun {
  testing::CliResult cli;
  std::vector<double> losses;
};

class MixtureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/meshrun_mixture_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    temp_ = new fs::path(pattern);
    WriteLlmcShards(testing::ReadFile(kMixCodeText), *temp_ / "code");
    mix_code_glob = new std::string((*temp_ / "code" / "code_*.bin").string());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*temp_, ec);
    delete temp_;
    temp_ = nullptr;
    delete mix_code_glob;
    mix_code_glob = nullptr;
  }

  // `meshrun train` of tiny.yaml for 6 steps with the 0.7/0.3 mixture (or `train`), shuffled,
  // checkpoints every 3 steps in temp/ckpt, on dp_shard S × tp T.
  static MixRun Train(int S, int T, const std::string& ckpt, std::vector<std::string> extra = {},
                      const std::string& train = MixtureSet(0.7, 0.3)) {
    const fs::path binary = fs::path(std::getenv("MESHRUN_BINARY_DIR")) / "bin/meshrun";
    const fs::path spec = fs::path(std::getenv("MESHRUN_SOURCE_DIR")) / "examples/tiny.yaml";
    std::vector<std::string> args = {"train",
                                     "-f",
                                     spec.string(),
                                     "--nproc",
                                     std::to_string(S * T),
                                     "-o",
                                     "json",
                                     "--set",
                                     "train.steps=6",
                                     "--set",
                                     "checkpoint.every=3",
                                     "--set",
                                     "checkpoint.dir=" + (*temp_ / ckpt).string(),
                                     "--set",
                                     "data.order=shuffled",
                                     "--set",
                                     "data.format=auto",
                                     "--set",
                                     "parallelism.dp_shard_size=" + std::to_string(S),
                                     "--set",
                                     "parallelism.tp_size=" + std::to_string(T),
                                     "--set",
                                     train};
    args.insert(args.end(), extra.begin(), extra.end());
    MixRun r;
    r.cli = testing::RunCli(binary, args, *temp_ / (ckpt + ".stderr"), 120);
    for (const std::string& line : testing::Lines(r.cli.out)) {
      const json j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("event", "") == "step") r.losses.push_back(j["loss"]);
    }
    return r;
  }

  static const MixRun& Baseline() {
    static MixRun* base = new MixRun(Train(1, 1, "baseline"));
    return *base;
  }

  // Steps 4–6 of a copy of `source`'s step-3 checkpoint resumed on dp_shard S × tp T.
  static void ExpectResumesWithTheBaselineLosses(const std::string& source, int S, int T) {
    SCOPED_TRACE(source + " resumed on dp_shard " + std::to_string(S) + " x tp " +
                 std::to_string(T));
    const std::string dir = source + "-S" + std::to_string(S) + "T" + std::to_string(T);
    fs::copy(*temp_ / source, *temp_ / dir, fs::copy_options::recursive);
    const MixRun r = Train(S, T, dir);
    ASSERT_EQ(r.cli.exit_code, 0) << r.cli.err;
    EXPECT_NE(r.cli.err.find("resumed from"), std::string::npos) << r.cli.err;
    ASSERT_EQ(r.losses.size(), 3u) << r.cli.out;
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(r.losses[k], Baseline().losses[3 + k], 1e-5) << "step " << k + 4;
    }
  }

  static fs::path* temp_;
};

fs::path* MixtureTest::temp_ = nullptr;

TEST_F(MixtureTest, SameLossesOnOneRankAndOnDpShard2Tp2) {
  const MixRun& base = Baseline();
  ASSERT_EQ(base.cli.exit_code, 0) << base.cli.err;
  ASSERT_EQ(base.losses.size(), 6u) << base.cli.out;
  const MixRun mesh = Train(2, 2, "s2t2");
  ASSERT_EQ(mesh.cli.exit_code, 0) << mesh.cli.err;
  ASSERT_EQ(mesh.losses.size(), 6u) << mesh.cli.out;
  for (size_t k = 0; k < 6; ++k)
    EXPECT_NEAR(mesh.losses[k], base.losses[k], 1e-5) << "step " << k + 1;
  // The mixture is what trained: one source alone gives other batches, so other losses.
  const MixRun web = Train(1, 1, "web-only", {}, std::string("data.train=") + kMixWeb);
  ASSERT_EQ(web.cli.exit_code, 0) << web.cli.err;
  ASSERT_EQ(web.losses.size(), 6u);
  EXPECT_GT(std::abs(web.losses[0] - base.losses[0]), 1e-3);
  // The checkpoint records the sources, their weights and the windows each gave.
  StatusOr<CheckpointReader> reader =
      CheckpointReader::Open((*temp_ / "baseline/step-00000003").string());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const json trainer = json::parse(reader->metadata().trainer_json);
  const json& data = trainer["data"];
  EXPECT_EQ(data["mixture"], true);
  EXPECT_EQ(data["slot"], 24);
  ASSERT_EQ(data["sources"].size(), 2u);
  EXPECT_EQ(data["sources"][0]["path"], kMixWeb);
  EXPECT_EQ(data["sources"][1]["weight"], 0.3);
  // 24 windows at 0.7/0.3: 17 and 7 (each within one of 16.8 and 7.2).
  EXPECT_EQ(data["sources"][0]["taken"], 17);
  EXPECT_EQ(data["sources"][1]["taken"], 7);
}

TEST_F(MixtureTest, InterruptedOnDpShard2ResumesOnOtherMeshesWithTheSameLosses) {
  ASSERT_EQ(Baseline().cli.exit_code, 0) << Baseline().cli.err;
  ASSERT_EQ(Baseline().losses.size(), 6u);
  const MixRun first = Train(2, 1, "interrupted", {"--stop-after", "3"});
  ASSERT_EQ(first.cli.exit_code, 0) << first.cli.err;
  ASSERT_EQ(first.losses.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(first.losses[k], Baseline().losses[k], 1e-5);
  ASSERT_TRUE(fs::exists(*temp_ / "interrupted/step-00000003/metadata.json"));
  ExpectResumesWithTheBaselineLosses("interrupted", 2, 2);
  ExpectResumesWithTheBaselineLosses("interrupted", 1, 1);
}

TEST_F(MixtureTest, ResumeWithOtherSourcesOrWeightsIsRefused) {
  const MixRun first = Train(1, 1, "refuse", {"--stop-after", "3"});
  ASSERT_EQ(first.cli.exit_code, 0) << first.cli.err;
  const MixRun other_weights = Train(1, 1, "refuse", {}, MixtureSet(0.5, 0.5));
  EXPECT_EQ(other_weights.cli.exit_code, 2) << other_weights.cli.err;
  EXPECT_NE(other_weights.cli.err.find("error: data.train: the checkpoint"), std::string::npos)
      << other_weights.cli.err;
  EXPECT_NE(other_weights.cli.err.find("this spec reads [" + std::string(kMixWeb) + " 0.5"),
            std::string::npos)
      << other_weights.cli.err;
  EXPECT_TRUE(other_weights.losses.empty());
  const MixRun single = Train(1, 1, "refuse", {}, std::string("data.train=") + kMixWeb);
  EXPECT_EQ(single.cli.exit_code, 2) << single.cli.err;
  EXPECT_NE(single.cli.err.find("this spec reads one data.train path"), std::string::npos)
      << single.cli.err;
  // A recorded position the order does not give (a changed rule, a tampered file) is refused.
  fs::copy(*temp_ / "refuse", *temp_ / "tampered", fs::copy_options::recursive);
  const fs::path metadata = *temp_ / "tampered/step-00000003/metadata.json";
  json meta = json::parse(testing::ReadFile(metadata));
  meta["trainer"]["data"]["sources"][0]["taken"] = 16;
  std::ofstream(metadata) << meta.dump(2) << "\n";
  const MixRun tampered = Train(1, 1, "tampered");
  EXPECT_EQ(tampered.cli.exit_code, 1) << tampered.cli.err;
  EXPECT_NE(tampered.cli.err.find("source 0 of data.train had given 16 windows at step 3, the "
                                  "order of docs/data.md gives 17"),
            std::string::npos)
      << tampered.cli.err;
  // The same weights written differently (7 and 3) are the same mixture: it resumes.
  const MixRun same = Train(1, 1, "refuse", {}, MixtureSet(7, 3));
  EXPECT_EQ(same.cli.exit_code, 0) << same.cli.err;
  EXPECT_EQ(same.losses.size(), 3u);
}

}  // namespace
}  // namespace meshrun
