// A tab in a job spec's indentation is named as such, with its line and column (yaml-cpp alone
// says "illegal map value"); tabs elsewhere (after the colon, before a comment) stay allowed.
#include <gtest/gtest.h>

#include <string>

#include "common/job_spec_yaml.h"

namespace meshrun {
namespace {

TEST(JobSpecYamlTabTest, TabIndentationIsNamedWithLineAndColumn) {
  const std::string text = "name: t\ndata:\n  train: a\nmodel:\n\tn_layer: 2\n";
  StatusOr<JobSpec> spec = ParseJobSpecYaml(text, {}, "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "job.yaml: line 5, column 1: a tab in the indentation; YAML does not allow tabs for "
            "indentation (hint: indent with spaces)");
}

TEST(JobSpecYamlTabTest, TabAfterSpacesIsFoundToo) {
  const std::string text = "name: t\ndata:\n  train: a\ntrain:\n  steps: 3\n  \tlr: 0.1\n";
  StatusOr<JobSpec> spec = ParseJobSpecYaml(text, {}, "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("line 6, column 3: a tab in the indentation"),
            std::string::npos)
      << spec.status().message();
}

TEST(JobSpecYamlTabTest, TabsOutsideTheIndentationAreAllowed) {
  StatusOr<JobSpec> spec =
      ParseJobSpecYaml("data:\n  train:\ta   \t# a comment after tabs\n", {}, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->data.train, "a");
  // Other malformed YAML keeps its message.
  StatusOr<JobSpec> bad = ParseJobSpecYaml("data: [a\n", {}, "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("malformed YAML"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace meshrun
