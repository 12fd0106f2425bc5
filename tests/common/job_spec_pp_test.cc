// The pipeline fields of the job spec (issue 33): parallelism.pp_size, pp_schedule (parsed once
// into PpSchedule), pp_virtual_stages and pp_layers; one case per validation rule with its exact
// message, and the YAML reader/writer of the list field.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/job_spec_yaml.h"

namespace meshrun {
namespace {

// 6 layers, global batch 8, micro-batch 2: 4 micro-batches per step on one dp rank.
JobSpec PpSpec(int pp) {
  JobSpec spec;
  spec.data.train = "/data/train.txt";
  spec.model.n_layer = 6;
  spec.parallelism.pp_size = pp;
  return spec;
}

std::string Error(const JobSpec& spec) {
  return ValidateJobSpec(spec).message();
}

TEST(JobSpecPpTest, DefaultsAndTheScheduleEnum) {
  const JobSpec s;
  EXPECT_EQ(s.parallelism.pp_size, 1);
  EXPECT_EQ(s.parallelism.pp_schedule, "1f1b");
  EXPECT_EQ(s.parallelism.pp_virtual_stages, 1);
  EXPECT_TRUE(s.parallelism.pp_layers.empty());
  EXPECT_EQ(PpScheduleOf(s.parallelism), PpSchedule::k1F1B);
  for (PpSchedule k : {PpSchedule::k1F1B, PpSchedule::kInterleaved1F1B, PpSchedule::kZeroBubble}) {
    EXPECT_EQ(ParsePpSchedule(PpScheduleName(k)), k);
  }
  EXPECT_EQ(ParsePpSchedule("gpipe"), std::nullopt);
  EXPECT_EQ(MicroBatchesPerStep(PpSpec(2)), 4);
  EXPECT_TRUE(ValidateJobSpec(PpSpec(1)).ok());
  JobSpec p = PpSpec(1);
  p.parallelism.pp_layers = {6};
  EXPECT_TRUE(ValidateJobSpec(p).ok()) << Error(p);
}

TEST(JobSpecPpTest, MeshOfIsFiveAxis) {
  JobSpec s = PpSpec(2);
  s.parallelism.dp_shard_size = 2;
  s.parallelism.tp_size = 2;
  const ParallelDims mesh = MeshOf(s).value();
  EXPECT_EQ(mesh.pp(), 2);
  EXPECT_EQ(mesh.world_size(), 8);
}

TEST(JobSpecPpTest, EveryRuleNamesTheFieldTheValuesAndAFix) {
  struct Case {
    const char* what;
    JobSpec spec;
    std::string message;
  };
  std::vector<Case> cases;
  {
    JobSpec s = PpSpec(0);
    cases.push_back({"pp_size 0", s,
                     "parallelism.pp_size: must be at least 1, got 0 (hint: set pp_size to 1 or "
                     "more; 1 means no pipeline parallelism)"});
  }
  {
    JobSpec s = PpSpec(8);
    s.train.global_batch_size = 16;
    cases.push_back({"more stages than layers", s,
                     "parallelism.pp_size: pp_size(8) is more than model.n_layer(6); every stage "
                     "needs at least one transformer layer (hint: use a pp_size of at most 6)"});
  }
  {
    JobSpec s = PpSpec(2);
    s.parallelism.pp_virtual_stages = 0;
    cases.push_back({"virtual 0", s,
                     "parallelism.pp_virtual_stages: must be at least 1, got 0 (hint: use 1, or 2 "
                     "or more with pp_schedule: interleaved_1f1b)"});
  }
  {
    JobSpec s = PpSpec(2);
    s.parallelism.pp_virtual_stages = 2;
    cases.push_back({"virtual without interleaved", s,
                     "parallelism.pp_virtual_stages: 2 virtual stages with pp_schedule '1f1b'; "
                     "only interleaved_1f1b runs virtual stages (hint: set pp_schedule: "
                     "interleaved_1f1b, or pp_virtual_stages: 1)"});
  }
  {
    JobSpec s = PpSpec(2);
    s.parallelism.pp_schedule = "interleaved_1f1b";
    cases.push_back({"interleaved without virtual", s,
                     "parallelism.pp_virtual_stages: 1 with pp_schedule 'interleaved_1f1b', which "
                     "gives each rank 2 or more model chunks (hint: set pp_virtual_stages: 2 (or "
                     "more), or pp_schedule: 1f1b)"});
  }
  {
    JobSpec s = PpSpec(4);
    s.parallelism.pp_schedule = "interleaved_1f1b";
    s.parallelism.pp_virtual_stages = 2;
    cases.push_back({"more chunks than layers", s,
                     "parallelism.pp_virtual_stages: pp_size(4)·pp_virtual_stages(2) = 8 model "
                     "chunks but model.n_layer is 6; every chunk needs at least one layer (hint: "
                     "use pp_size·pp_virtual_stages of at most 6)"});
  }
  {
    JobSpec s = PpSpec(2);
    s.parallelism.pp_layers = {3, 0, 3};
    cases.push_back({"a chunk of 0 layers", s,
                     "parallelism.pp_layers: [3, 0, 3] gives chunk 1 0 layers; every stage holds "
                     "at least one (hint: give every entry 1 or more, or leave pp_layers out "
                     "(null) to split by cost)"});
  }
  {
    JobSpec s = PpSpec(4);
    s.parallelism.pp_layers = {3, 3};
    cases.push_back({"wrong entry count", s,
                     "parallelism.pp_layers: [3, 3] has 2 entries but pp_size(4)·"
                     "pp_virtual_stages(1) = 4 chunks (hint: give one layer count per chunk (4 "
                     "entries), or leave pp_layers out (null) to split by cost)"});
  }
  {
    JobSpec s = PpSpec(2);
    s.parallelism.pp_layers = {3, 2};
    cases.push_back({"wrong sum", s,
                     "parallelism.pp_layers: [3, 2] sums to 5 but model.n_layer is 6 (hint: make "
                     "the entries sum to 6, or leave pp_layers out (null) to split by cost)"});
  }
  {
    JobSpec s = PpSpec(4);
    s.train.global_batch_size = 4;
    cases.push_back({"fewer micro-batches than stages", s,
                     "train.global_batch_size: global_batch_size(4) / (dp_replicate_size(1)·"
                     "dp_shard_size(1)·micro_batch_size(2)) = 2 micro-batches per step, fewer "
                     "than pp_size(4): the pipeline never fills, stages would idle (hint: use a "
                     "global_batch_size of at least 8, or a smaller micro_batch_size or "
                     "pp_size)"});
  }
  {
    JobSpec s = PpSpec(4);
    s.train.global_batch_size = 12;
    s.model.n_layer = 8;
    s.parallelism.pp_schedule = "interleaved_1f1b";
    s.parallelism.pp_virtual_stages = 2;
    cases.push_back({"interleaved needs M % P == 0", s,
                     "train.global_batch_size: global_batch_size(12) / (dp_replicate_size(1)·"
                     "dp_shard_size(1)·micro_batch_size(2)) = 6 micro-batches per step, not a "
                     "multiple of pp_size(4) as interleaved_1f1b needs (micro-batches go round "
                     "the stages in groups of pp_size) (hint: use a global_batch_size that gives "
                     "a multiple of 4 micro-batches, or pp_schedule: 1f1b)"});
  }
  {
    JobSpec s = PpSpec(2);
    s.parallelism.pp_schedule = "gpipe";
    cases.push_back({"unknown schedule", s,
                     "parallelism.pp_schedule: 'gpipe' is not one of '1f1b', 'interleaved_1f1b' "
                     "or 'zero_bubble' (hint: use '1f1b', 'interleaved_1f1b' or "
                     "'zero_bubble')"});
  }
  {
    JobSpec s = PpSpec(2);
    s.parallelism.auto_mesh = true;
    cases.push_back({"pp_size with auto", s,
                     "parallelism.pp_size: pp_size(2) given with parallelism.auto: true, which "
                     "chooses the sizes (hint: leave the sizes out with auto: true, or set "
                     "parallelism.auto: false)"});
  }
  for (const Case& c : cases) {
    const Status st = ValidateJobSpec(c.spec);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(st.message(), c.message) << c.what;
  }
  // --nproc names pp_size in the product.
  JobSpec s = PpSpec(2);
  EXPECT_EQ(ValidateJobSpec(s, 4).message(),
            "parallelism: pp_size(2)·dp_replicate_size(1)·dp_shard_size(1)·cp_size(1)·tp_size(1) "
            "= world size 2 but --nproc is 4 (hint: pass --nproc 2, or choose sizes whose product "
            "is 4)");
}

TEST(JobSpecPpTest, YamlReadsAndWritesTheLayerList) {
  StatusOr<JobSpec> parsed = ParseJobSpecYaml(
      "model: {n_layer: 6}\n"
      "parallelism: {pp_schedule: interleaved_1f1b, pp_virtual_stages: 2, pp_layers: [2, 4]}\n"
      "data: {train: x}\n",
      {});
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->parallelism.pp_layers, (std::vector<int>{2, 4}));
  EXPECT_EQ(PpScheduleOf(parsed->parallelism), PpSchedule::kInterleaved1F1B);
  const std::string yaml = JobSpecToYaml(*parsed);
  EXPECT_NE(yaml.find("pp_layers: [2, 4]"), std::string::npos) << yaml;
  StatusOr<JobSpec> again = ParseJobSpecYaml(yaml, {});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *parsed);
  // null, by default and written out.
  StatusOr<JobSpec> plain = ParseJobSpecYaml("data: {train: x}\n", {"parallelism.pp_layers=null"});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_TRUE(plain->parallelism.pp_layers.empty());
  EXPECT_NE(JobSpecToYaml(*plain).find("pp_layers: ~"), std::string::npos) << JobSpecToYaml(*plain);
  // --set takes a list too.
  StatusOr<JobSpec> set = ParseJobSpecYaml("data: {train: x}\n", {"parallelism.pp_layers=[2]"});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->parallelism.pp_layers, (std::vector<int>{2}));
  // Not a list of integers.
  StatusOr<JobSpec> bad =
      ParseJobSpecYaml("parallelism: {pp_layers: [2, x]}\ndata: {train: x}\n", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("parallelism.pp_layers[1]: expected an integer"),
            std::string::npos)
      << bad.status().message();
  StatusOr<JobSpec> scalar =
      ParseJobSpecYaml("parallelism: {pp_layers: 3}\ndata: {train: x}\n", {});
  ASSERT_FALSE(scalar.ok());
  EXPECT_NE(scalar.status().message().find("parallelism.pp_layers: expected a list of integers"),
            std::string::npos)
      << scalar.status().message();
}

TEST(JobSpecPpTest, OneFOneBInterleavedAndZeroBubbleAllRun) {
  JobSpec s = PpSpec(2);
  EXPECT_TRUE(ValidateJobSpec(s).ok()) << Error(s);
  // Zero-bubble (ZB-H1, decision 0059) runs, with one model chunk per stage.
  s.parallelism.pp_schedule = "zero_bubble";
  EXPECT_TRUE(ValidateJobSpec(s).ok()) << Error(s);
  s.parallelism.pp_virtual_stages = 2;
  EXPECT_NE(Error(s).find("only interleaved_1f1b runs virtual stages"), std::string::npos)
      << Error(s);
  s.parallelism.pp_schedule = "interleaved_1f1b";
  s.parallelism.pp_virtual_stages = 3;
  s.train.global_batch_size = 16;
  EXPECT_TRUE(ValidateJobSpec(s).ok()) << Error(s);
}

}  // namespace
}  // namespace meshrun
