// resources.elastic (docs/job-spec.md "Elastic jobs", decision 0056): parsed from YAML and --set,
// written back as a group, validated with the field, the values and a fix, and the data-axes
// mesh an elastic job runs with on another world size (tp and cp kept, global batch kept).
#include <gtest/gtest.h>

#include "common/job_spec.h"
#include "common/job_spec_yaml.h"

namespace meshrun {
namespace {

constexpr const char* kElasticSpec = R"(name: el
model: {n_layer: 2, n_head: 4, d_model: 64, seq_len: 64}
parallelism: {dp_shard_size: 2, tp_size: 2}
train: {global_batch_size: 8, micro_batch_size: 2}
data: {train: /data/train.txt}
checkpoint: {dir: /tmp/ck, every: 2}
resources: {elastic: {min_ranks: 2, max_ranks: 4, wait_seconds: 5}}
)";

std::string ElasticSpecError(const std::vector<std::string>& overrides,
                             const char* text = kElasticSpec) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(text, overrides);
  if (!spec.ok()) return spec.status().message();
  Status valid = ValidateJobSpec(*spec);
  return valid.ok() ? "" : valid.message();
}

TEST(JobSpecElasticTest, ParsesValidatesAndRoundTrips) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(kElasticSpec, {});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec).ToString();
  EXPECT_TRUE(spec->resources.elastic());
  EXPECT_EQ(spec->resources.elastic_min_ranks, 2);
  EXPECT_EQ(spec->resources.elastic_max_ranks, 4);
  EXPECT_EQ(spec->resources.elastic_wait_seconds, 5);
  const std::string yaml = JobSpecToYaml(*spec);
  EXPECT_NE(yaml.find("elastic:"), std::string::npos) << yaml;
  StatusOr<JobSpec> back = ParseJobSpecYaml(yaml, {});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *spec);
  StatusOr<JobSpec> set = ParseJobSpecYaml(kElasticSpec, {"resources.elastic.min_ranks=4"});
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->resources.elastic_min_ranks, 4);
}

TEST(JobSpecElasticTest, AJobWithoutElasticIsAFixedWorld) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml("data: {train: /d}\n", {});
  ASSERT_TRUE(spec.ok());
  EXPECT_FALSE(spec->resources.elastic());
  StatusOr<JobSpec> null = ParseJobSpecYaml("data: {train: /d}\nresources: {elastic: null}\n", {});
  ASSERT_TRUE(null.ok()) << null.status().ToString();
  EXPECT_FALSE(null->resources.elastic());
  EXPECT_EQ(*null, *spec);
}

TEST(JobSpecElasticTest, BadValuesNameFieldValueAndFix) {
  EXPECT_EQ(ElasticSpecError({"resources.elastic.min_ranks=5"})
                .rfind("resources.elastic.min_ranks: 5 is over max_ranks(4)", 0),
            0u)
      << ElasticSpecError({"resources.elastic.min_ranks=5"});
  EXPECT_EQ(ElasticSpecError({"resources.elastic.min_ranks=-1"})
                .rfind("resources.elastic.min_ranks: must be at least 1, got -1", 0),
            0u);
  const std::string odd = ElasticSpecError({"resources.elastic.max_ranks=5"});
  EXPECT_EQ(
      odd.rfind("resources.elastic.max_ranks: no valid mesh has 5 ranks keeping tp_size(2)", 0), 0u)
      << odd;
  EXPECT_NE(odd.find("(hint: use a world size with a valid mesh, such as"), std::string::npos)
      << odd;
  EXPECT_EQ(ElasticSpecError({"resources.elastic.wait_seconds=-1"})
                .rfind("resources.elastic.wait_seconds: must be in [0, 86400], got -1", 0),
            0u);
  EXPECT_EQ(ElasticSpecError({"checkpoint.dir="})
                .rfind("resources.elastic: an elastic job needs "
                       "checkpoint.dir",
                       0),
            0u);
  // The mesh's world (4) must lie within [min, max].
  EXPECT_EQ(ElasticSpecError({"resources.elastic.max_ranks=2"})
                .rfind("resources.elastic.min_ranks: the mesh's world size 4 is outside", 0),
            0u)
      << ElasticSpecError({"resources.elastic.max_ranks=2"});
  EXPECT_EQ(ElasticSpecError({}, "data: {train: /d}\nresources: {elastic: {wait_seconds: 9}}\n")
                .rfind("resources.elastic.wait_seconds: 9 is given without min_ranks", 0),
            0u);
  // An unknown key of the group.
  EXPECT_NE(ElasticSpecError({}, "data: {train: /d}\nresources: {elastic: {min: 1}}\n")
                .find("resources.elastic.min"),
            std::string::npos);
}

TEST(JobSpecElasticTest, DataAxesShrinkAndKeepTpAndTheBatch) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(kElasticSpec, {});
  ASSERT_TRUE(spec.ok());
  std::optional<ParallelismSpec> two = ElasticDataAxesMesh(*spec, 2);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->tp_size, 2);
  EXPECT_EQ(two->dp_shard_size, 1);
  EXPECT_EQ(two->dp_replicate_size, 1);
  std::optional<ParallelismSpec> four = ElasticDataAxesMesh(*spec, 4);
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(four->dp_shard_size, 2);
  EXPECT_FALSE(ElasticDataAxesMesh(*spec, 3).has_value());  // tp 2 does not divide 3
  // 16 ranks: dp 8, and 8 sequences in micro-batches of 2 do not split over 8 dp ranks.
  EXPECT_FALSE(ElasticDataAxesMesh(*spec, 16).has_value());
  // dp_replicate is kept where it divides the data axes, else the largest divisor below it.
  JobSpec hsdp = *spec;
  hsdp.parallelism.dp_replicate_size = 2;
  hsdp.parallelism.dp_shard_size = 1;
  std::optional<ParallelismSpec> r = ElasticDataAxesMesh(hsdp, 2);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->dp_replicate_size, 1);
  EXPECT_EQ(r->dp_shard_size, 1);
}

}  // namespace
}  // namespace meshrun
