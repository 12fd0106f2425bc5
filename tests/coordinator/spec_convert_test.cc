// JobSpec proto <-> struct: round trip, validation through common/, narrowing and the model
// sizes a client may leave to init_from.
#include "proto/spec_convert.h"

#include <gtest/gtest.h>

#include "tests/coordinator/test_util.h"

namespace meshrun::coordinator {
namespace {

TEST(SpecConvertTest, RoundTripsEveryField) {
  JobSpec spec;
  spec.name = "round-trip";
  spec.model.init_from = "/hf/gpt2";
  spec.parallelism = {2, 2, 1, 2, "ring"};
  spec.train.steps = 7;
  spec.train.seed = 99;
  spec.train.lr = 1e-3;
  spec.data.train = "/d/train.bin";
  spec.data.val = "/d/val.bin";
  spec.data.eval_every = 3;
  spec.checkpoint = {"/ckpt", 2, 3, "never"};
  spec.resources = {"cuda", 4};
  spec.restart.max_restarts = 5;
  StatusOr<JobSpec> back = JobSpecFromProto(JobSpecToProto(spec));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, spec);
}

TEST(SpecConvertTest, ValidSpecPasses) {
  EXPECT_TRUE(ValidateProtoJobSpec(testing::SpecProto(2, 2, 2, 2)).ok());
}

TEST(SpecConvertTest, InvalidSpecNamesTheField) {
  v1::JobSpec p = testing::SpecProto(1, 1, 1, 3);  // n_head 8 is not divisible by 3
  StatusOr<JobSpec> s = ValidateProtoJobSpec(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message().rfind("parallelism.tp_size: ", 0), 0u) << s.status().message();
  EXPECT_NE(s.status().message().find("(hint: "), std::string::npos);

  p = testing::SpecProto(1, 1, 1, 1);
  p.mutable_parallelism()->set_cp_size(0);
  s = ValidateProtoJobSpec(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("parallelism.cp_size: ", 0), 0u) << s.status().message();

  p = testing::SpecProto(1, 1, 1, 1);
  p.mutable_resources()->set_device("tpu");
  s = ValidateProtoJobSpec(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("resources.device: ", 0), 0u) << s.status().message();

  p = testing::SpecProto(1, 1, 1, 1);
  p.mutable_data()->clear_train();
  s = ValidateProtoJobSpec(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("data.train: ", 0), 0u) << s.status().message();
}

TEST(SpecConvertTest, Int64OverflowIsAnError) {
  v1::JobSpec p = testing::SpecProto(1, 1, 1, 1);
  p.mutable_train()->set_steps(int64_t{1} << 40);
  StatusOr<JobSpec> s = JobSpecFromProto(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("train.steps: ", 0), 0u) << s.status().message();
}

TEST(SpecConvertTest, ModelSizesMayComeFromInitFrom) {
  v1::JobSpec p = testing::SpecProto(1, 1, 2, 4);
  p.mutable_model()->clear_n_head();
  StatusOr<JobSpec> s = ValidateProtoJobSpec(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("model.n_head: required field is missing", 0), 0u);

  p.mutable_model()->set_init_from("/hf/gpt2");
  p.mutable_model()->clear_d_model();
  p.mutable_model()->clear_seq_len();
  p.mutable_model()->clear_vocab_size();
  p.mutable_model()->clear_n_layer();
  s = ValidateProtoJobSpec(p);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
}

}  // namespace
}  // namespace meshrun::coordinator
