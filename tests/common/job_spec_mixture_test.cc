// data.train as a weighted mixture (docs/job-spec.md, docs/data.md "Mixtures"): the list form
// through the YAML reader and writer, --set, ValidateJobSpec, the path policy and the proto.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/job_spec.h"
#include "common/job_spec_yaml.h"
#include "common/path_policy.h"
#include "proto/spec_convert.h"

namespace meshrun {
namespace {

constexpr const char* kMixtureSpec = R"(name: mix
data:
  train:
    - {path: /data/web.bin, weight: 0.7}
    - path: /data/code.bin
      weight: 0.3
  order: shuffled
)";

std::string MixErrorOf(const std::string& text, const std::vector<std::string>& overrides = {}) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(text, overrides, "job.yaml");
  if (spec.ok()) return "OK";
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << spec.status().ToString();
  return spec.status().message();
}

TEST(JobSpecMixtureTest, ListOfSourcesParsesPrintsAndReparses) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(kMixtureSpec, {});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.train, "");
  ASSERT_EQ(spec->data.train_sources.size(), 2u);
  EXPECT_EQ(spec->data.train_sources[0], (DataSource{"/data/web.bin", 0.7}));
  EXPECT_EQ(spec->data.train_sources[1], (DataSource{"/data/code.bin", 0.3}));
  const std::string yaml = JobSpecToYaml(*spec);
  EXPECT_NE(yaml.find("{path: /data/web.bin, weight: 0.7}"), std::string::npos) << yaml;
  StatusOr<JobSpec> again = ParseJobSpecYaml(yaml, {});
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << yaml;
  EXPECT_EQ(*again, *spec);
  // A single path prints as before.
  StatusOr<JobSpec> single = ParseJobSpecYaml("data: {train: /data/a.txt}\n", {});
  ASSERT_TRUE(single.ok());
  EXPECT_TRUE(single->data.train_sources.empty());
  EXPECT_NE(JobSpecToYaml(*single).find("train: /data/a.txt"), std::string::npos);
  // A source without a weight weighs 1.
  StatusOr<JobSpec> unweighted = ParseJobSpecYaml("data: {train: [{path: a}, {path: b}]}\n", {});
  ASSERT_TRUE(unweighted.ok()) << unweighted.status().ToString();
  EXPECT_EQ(unweighted->data.train_sources[1], (DataSource{"b", 1.0}));
}

TEST(JobSpecMixtureTest, SetDataTrainReplacesTheListAndCanGiveOne) {
  StatusOr<JobSpec> single = ParseJobSpecYaml(kMixtureSpec, {"data.train=/data/one.txt"});
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_EQ(single->data.train, "/data/one.txt");
  EXPECT_TRUE(single->data.train_sources.empty());
  StatusOr<JobSpec> list =
      ParseJobSpecYaml("data: {train: /data/one.txt}\n", {"data.train=[{path: x, weight: 2}]"});
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->data.train, "");
  EXPECT_EQ(list->data.train_sources, (std::vector<DataSource>{{"x", 2.0}}));
}

TEST(JobSpecMixtureTest, BadSourcesNameTheFieldAndTheFix) {
  EXPECT_EQ(MixErrorOf("data:\n  train: []\n"),
            "data.train: the list of sources is empty (line 2) (hint: give a path, or a list "
            "[{path: PATH, weight: W}, ...])");
  EXPECT_EQ(MixErrorOf("data:\n  train: [{path: a, weight: 0}]\n"),
            "data.train[0].weight: must be a finite number in (0, inf), got 0 (line 2) (hint: use "
            "a positive weight such as 0.3; weights are normalized)");
  EXPECT_NE(MixErrorOf("data: {train: [{path: a, weight: -1}]}\n").find("data.train[0].weight"),
            std::string::npos);
  EXPECT_NE(MixErrorOf("data: {train: [{path: a, weight: .nan}]}\n").find("data.train[0].weight"),
            std::string::npos);
  EXPECT_NE(MixErrorOf("data: {train: [{path: a}, {weight: 1}]}\n")
                .find("data.train[1].path: required field is missing"),
            std::string::npos);
  EXPECT_NE(MixErrorOf("data: {train: [{path: a, wieght: 1}]}\n")
                .find("data.train[0].wieght: unknown field"),
            std::string::npos);
  EXPECT_NE(MixErrorOf("data: {train: [{path: a, weight: heavy}]}\n")
                .find("data.train[0].weight: expected a number, got 'heavy'"),
            std::string::npos);
  EXPECT_NE(MixErrorOf("data: {train: [a.txt]}\n").find("data.train[0]: expected a mapping"),
            std::string::npos);
  EXPECT_NE(MixErrorOf("data: {train: [{path: a, weight: 1}, {path: b, weight: 1.0e-9}]}\n")
                .find("data.train[1].weight: 1e-09 is less than 1e-6 of the weights' sum"),
            std::string::npos);
  // ValidateJobSpec: a spec (e.g. from the proto) with both forms.
  JobSpec both;
  both.data.train = "a";
  both.data.train_sources = {{"b", 1}};
  EXPECT_NE(ValidateJobSpec(both).message().find("data.train: holds both a path and a list"),
            std::string::npos);
}

TEST(JobSpecMixtureTest, TrainSourcesAndFields) {
  DataSpec d;
  d.train = "a.txt";
  EXPECT_EQ(TrainSources(d), (std::vector<DataSource>{{"a.txt", 1.0}}));
  EXPECT_EQ(TrainSourceField(d, 0), "data.train");
  d.train.clear();
  d.train_sources = {{"x", 0.7}, {"y", 0.3}};
  EXPECT_EQ(TrainSources(d), d.train_sources);
  EXPECT_EQ(TrainSourceField(d, 1), "data.train[1]");
}

TEST(JobSpecMixtureTest, ProtoCarriesTheSourcesAndKeepsTrainForOnePath) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(kMixtureSpec, {});
  ASSERT_TRUE(spec.ok());
  const v1::JobSpec proto = JobSpecToProto(*spec);
  ASSERT_EQ(proto.data().train_sources_size(), 2);
  EXPECT_EQ(proto.data().train_sources(1).path(), "/data/code.bin");
  EXPECT_EQ(proto.data().train_sources(1).weight(), 0.3);
  EXPECT_EQ(proto.data().train(), "");
  StatusOr<JobSpec> back = JobSpecFromProto(proto);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *spec);
  // An old client's message: only `train`.
  v1::JobSpec old;
  old.mutable_data()->set_train("/data/a.txt");
  StatusOr<JobSpec> from_old = JobSpecFromProto(old);
  ASSERT_TRUE(from_old.ok());
  EXPECT_EQ(from_old->data.train, "/data/a.txt");
  EXPECT_TRUE(from_old->data.train_sources.empty());
  EXPECT_EQ(JobSpecToProto(*from_old).data().train_sources_size(), 0);
}

TEST(JobSpecMixtureTest, PathPolicyConfinesEverySource) {
  namespace fs = std::filesystem;
  const fs::path base =
      fs::temp_directory_path() / ("meshrun-mixture-policy-" + std::to_string(getpid()));
  fs::create_directories(base / "data");
  fs::create_directories(base / "ckpt");
  StatusOr<PathPolicy> policy =
      PathPolicy::Create({(base / "data").string()}, {(base / "ckpt").string()});
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  JobSpec spec;
  spec.data.train_sources = {{"web.bin", 0.7}, {"/etc/passwd", 0.3}};
  const JobSpec before = spec;
  Status s = policy->ConfineJobSpec(&spec, PathPolicy::Rewrite::kAbsolute);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("data.train[1]: /etc/passwd is outside", 0), 0u) << s.message();
  EXPECT_EQ(spec, before);  // a refused spec is left as it was
  spec.data.train_sources[1].path = "code.bin";
  s = policy->ConfineJobSpec(&spec, PathPolicy::Rewrite::kAbsolute);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(spec.data.train_sources[0].path, (base / "data" / "web.bin").string());
  EXPECT_EQ(spec.data.train_sources[1].path, (base / "data" / "code.bin").string());
  fs::remove_all(base);
}

}  // namespace
}  // namespace meshrun
