// `order: shuffled` across versions (docs/data.md "The shuffled order, exactly", decision 0042):
// a checkpoint records `"shuffle": "feistel"`; one written before the Feistel order (no
// `shuffle` in its data position) resumes with the stored Fisher–Yates order it was reading, on
// any mesh, says so, and its later checkpoints record `fisher-yates`; an unknown rule is refused.
// Real processes over Gloo on loopback, 6 steps of examples/tiny.yaml each.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/client/cli_runner.h"
#include "tests/integration/tiny_train.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using ShuffleRun = testing::TinyTrainRun;

class ShuffleResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/meshrun_shuffle_resume_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    temp_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }

  // `meshrun train` of tiny.yaml for 6 steps, shuffled, checkpoints every 3 steps in temp/ckpt,
  // on dp_shard S.
  ShuffleRun Train(int S, const std::string& ckpt, const std::vector<std::string>& extra = {}) {
    return testing::TrainTiny(
        temp_, S, ckpt, {"data.order=shuffled", "parallelism.dp_shard_size=" + std::to_string(S)},
        extra);
  }

  json Metadata(const std::string& step_dir) {
    return json::parse(testing::ReadFile(temp_ / step_dir / "metadata.json"));
  }
  void WriteMetadata(const std::string& step_dir, const json& meta) {
    std::ofstream(temp_ / step_dir / "metadata.json") << meta.dump(2) << "\n";
  }

  fs::path temp_;
};

TEST_F(ShuffleResumeTest, ACheckpointWithoutARuleContinuesTheFisherYatesOrderOnAnyMesh) {
  const ShuffleRun base = Train(1, "base");
  ASSERT_EQ(base.cli.exit_code, 0) << base.cli.err;
  ASSERT_EQ(base.losses.size(), 6u) << base.cli.out;
  EXPECT_EQ(Metadata("base/step-00000003")["trainer"]["data"]["shuffle"], "feistel");

  // A checkpoint as the previous version wrote it: the same, without "shuffle".
  fs::copy(temp_ / "base", temp_ / "old", fs::copy_options::recursive);
  fs::remove_all(temp_ / "old/step-00000006");
  json meta = Metadata("old/step-00000003");
  meta["trainer"]["data"].erase("shuffle");
  WriteMetadata("old/step-00000003", meta);
  fs::copy(temp_ / "old", temp_ / "old-1", fs::copy_options::recursive);

  const ShuffleRun dp2 = Train(2, "old");
  ASSERT_EQ(dp2.cli.exit_code, 0) << dp2.cli.err;
  EXPECT_NE(dp2.cli.err.find("was written before the Feistel shuffled order"), std::string::npos)
      << dp2.cli.err;
  ASSERT_EQ(dp2.losses.size(), 3u) << dp2.cli.out;
  // The previous order reads other windows than the Feistel run's steps 4–6 ...
  double most = 0;
  for (size_t k = 0; k < 3; ++k)
    most = std::max(most, std::abs(dp2.losses[k] - base.losses[3 + k]));
  EXPECT_GT(most, 1e-4);
  // ... the same on every mesh, and the run keeps it: its checkpoints say so.
  const ShuffleRun one = Train(1, "old-1");
  ASSERT_EQ(one.cli.exit_code, 0) << one.cli.err;
  ASSERT_EQ(one.losses.size(), 3u) << one.cli.out;
  for (size_t k = 0; k < 3; ++k)
    EXPECT_NEAR(one.losses[k], dp2.losses[k], 1e-5) << "step " << k + 4;
  EXPECT_EQ(Metadata("old/step-00000006")["trainer"]["data"]["shuffle"], "fisher-yates");

  // A checkpoint with the rule resumes the Feistel order: the uninterrupted run's losses.
  fs::copy(temp_ / "base", temp_ / "new", fs::copy_options::recursive);
  fs::remove_all(temp_ / "new/step-00000006");
  const ShuffleRun resumed = Train(2, "new");
  ASSERT_EQ(resumed.cli.exit_code, 0) << resumed.cli.err;
  EXPECT_EQ(resumed.cli.err.find("Feistel"), std::string::npos) << resumed.cli.err;
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t k = 0; k < 3; ++k)
    EXPECT_NEAR(resumed.losses[k], base.losses[3 + k], 1e-5) << "step " << k + 4;
}

TEST_F(ShuffleResumeTest, AnUnknownRuleIsRefused) {
  const ShuffleRun first = Train(1, "bogus", {"--stop-after", "3"});
  ASSERT_EQ(first.cli.exit_code, 0) << first.cli.err;
  json meta = Metadata("bogus/step-00000003");
  meta["trainer"]["data"]["shuffle"] = "riffle";
  WriteMetadata("bogus/step-00000003", meta);
  const ShuffleRun r = Train(1, "bogus");
  EXPECT_EQ(r.cli.exit_code, 1) << r.cli.err;
  EXPECT_NE(r.cli.err.find("data.shuffle \"riffle\" is not a shuffled order this meshrun knows"),
            std::string::npos)
      << r.cli.err;
  EXPECT_TRUE(r.losses.empty());
}

}  // namespace
}  // namespace meshrun
