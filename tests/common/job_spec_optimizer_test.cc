// train.optimizer and Lion's fields (docs/job-spec.md): parsed from YAML and --set, written back
// (lion as a group), the closed set refused with the field, the value and the choices, Lion's
// betas range-checked, and OptimizerOf/OptimizerName (the enum engine code reads).
#include <gtest/gtest.h>

#include "common/job_spec.h"
#include "common/job_spec_yaml.h"

namespace meshrun {
namespace {

constexpr const char* kOptimizerSpec = R"(name: opt
train:
  optimizer: lion
  lion: {beta1: 0.8, beta2: 0.98}
data:
  train: /data/train.txt
)";

std::string OptimizerSpecError(const std::vector<std::string>& overrides) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(kOptimizerSpec, overrides);
  if (!spec.ok()) return spec.status().message();
  Status valid = ValidateJobSpec(*spec);
  return valid.ok() ? "" : valid.message();
}

TEST(JobSpecOptimizerTest, LionAndItsBetasParseAndRoundTrip) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(kOptimizerSpec, {});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(ValidateJobSpec(*spec).ok());
  EXPECT_EQ(OptimizerOf(spec->train), OptimizerKind::kLion);
  EXPECT_EQ(spec->train.lion_beta1, 0.8);
  EXPECT_EQ(spec->train.lion_beta2, 0.98);
  const std::string yaml = JobSpecToYaml(*spec);
  EXPECT_NE(yaml.find("\n  optimizer: lion\n"), std::string::npos) << yaml;
  StatusOr<JobSpec> again = ParseJobSpecYaml(yaml, {});
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << yaml;
  EXPECT_EQ(*again, *spec);
  StatusOr<JobSpec> set =
      ParseJobSpecYaml(kOptimizerSpec, {"train.optimizer=adamw", "train.lion.beta2=0.9"});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(OptimizerOf(set->train), OptimizerKind::kAdamW);
  EXPECT_EQ(set->train.lion_beta2, 0.9);
}

TEST(JobSpecOptimizerTest, DefaultsAreAdamWAndThePapersBetas) {
  const TrainSpec train;
  EXPECT_EQ(train.optimizer, "adamw");
  EXPECT_EQ(OptimizerOf(train), OptimizerKind::kAdamW);
  EXPECT_EQ(train.lion_beta1, 0.9);
  EXPECT_EQ(train.lion_beta2, 0.99);
  EXPECT_STREQ(OptimizerName(OptimizerKind::kAdamW), "adamw");
  EXPECT_STREQ(OptimizerName(OptimizerKind::kLion), "lion");
  EXPECT_EQ(AllowedValues("train", "optimizer"), (std::vector<std::string>{"adamw", "lion"}));
}

TEST(JobSpecOptimizerTest, UnknownOptimizersAndBadBetasAreRefusedNamingTheField) {
  const std::string sgd = OptimizerSpecError({"train.optimizer=sgd"});
  EXPECT_EQ(sgd.rfind("train.optimizer: 'sgd' is not one of 'adamw' or 'lion'", 0), 0u) << sgd;
  EXPECT_NE(sgd.find("(hint: use 'adamw' or 'lion')"), std::string::npos) << sgd;
  EXPECT_EQ(OptimizerSpecError({"train.optimizer=Lion"}).substr(0, 40),
            "train.optimizer: 'Lion' is not one of 'a");
  EXPECT_EQ(OptimizerSpecError({"train.lion.beta1=1"}).rfind("train.lion.beta1: ", 0), 0u)
      << OptimizerSpecError({"train.lion.beta1=1"});
  EXPECT_EQ(OptimizerSpecError({"train.lion.beta2=-0.5"}).rfind("train.lion.beta2: ", 0), 0u)
      << OptimizerSpecError({"train.lion.beta2=-0.5"});
  EXPECT_NE(OptimizerSpecError({"train.lion.beta2=-0.5"}).find("hint:"), std::string::npos);
  EXPECT_NE(OptimizerSpecError({"train.lion.gamma=1"}).find("train.lion.gamma"), std::string::npos)
      << OptimizerSpecError({"train.lion.gamma=1"});
}

}  // namespace
}  // namespace meshrun
