// JobSpec proto <-> struct: round trip, validation through common/, narrowing, the defaults an
// unset field takes (the YAML parser's, from the one table of common/job_spec.h) and the model
// sizes a client may leave to init_from.
#include "proto/spec_convert.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>
#include <gtest/gtest.h>

#include <type_traits>

#include "common/job_spec_yaml.h"
#include "tests/coordinator/test_util.h"

namespace meshrun::coordinator {
namespace {

TEST(SpecConvertTest, RoundTripsEveryField) {
  JobSpec spec;
  spec.name = "round-trip";
  spec.model.init_from = "/hf/gpt2";
  spec.parallelism.dp_replicate_size = 2;
  spec.parallelism.dp_shard_size = 2;
  spec.parallelism.tp_size = 2;
  spec.parallelism.cp_comm_strategy = "ring";
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
  // Without init_from, a missing size is the YAML default, as in a YAML spec that leaves it out.
  v1::JobSpec p = testing::SpecProto(1, 1, 2, 4);
  p.mutable_model()->clear_n_head();
  StatusOr<JobSpec> s = JobSpecFromProto(p);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->model.n_head, JobSpec().model.n_head);

  // With init_from, the sizes left out are placeholders that pass validation; the stored spec
  // keeps them unset for the engine to read from config.json.
  p.mutable_model()->set_init_from("/hf/gpt2");
  p.mutable_model()->clear_d_model();
  p.mutable_model()->clear_seq_len();
  p.mutable_model()->clear_vocab_size();
  p.mutable_model()->clear_n_layer();
  s = ValidateProtoJobSpec(p);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const v1::JobSpec stored = ResolvedJobSpecProto(p, *s);
  EXPECT_FALSE(stored.model().has_n_head());
  EXPECT_FALSE(stored.model().has_n_layer());
  EXPECT_FALSE(stored.model().has_d_model());
  EXPECT_FALSE(stored.model().has_seq_len());
  EXPECT_FALSE(stored.model().has_vocab_size());
  EXPECT_EQ(stored.source_yaml(), p.source_yaml());
  EXPECT_TRUE(stored.train().has_lr());
}

// The bug this guards against: a client generated from the protos sent only what a YAML user
// writes and was refused with `parallelism.cp_comm_strategy: '' is not one of ...`, because the
// API did not apply the defaults the YAML path applies.
TEST(SpecConvertTest, UnsetFieldsTakeExactlyTheYamlDefaults) {
  const std::string yaml =
      "model: {n_layer: 2, n_head: 4, d_model: 64, seq_len: 64, vocab_size: 256}\n"
      "parallelism: {dp_shard_size: 2}\n"
      "train: {steps: 3}\n"
      "data: {train: /data/tiny.txt}\n";
  StatusOr<JobSpec> from_yaml = ParseJobSpecYaml(yaml, {});
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status().ToString();

  v1::JobSpec p;  // the same fields, nothing else
  p.mutable_model()->set_n_layer(2);
  p.mutable_model()->set_n_head(4);
  p.mutable_model()->set_d_model(64);
  p.mutable_model()->set_seq_len(64);
  p.mutable_model()->set_vocab_size(256);
  p.mutable_parallelism()->set_dp_shard_size(2);
  p.mutable_train()->set_steps(3);
  p.mutable_data()->set_train("/data/tiny.txt");
  StatusOr<JobSpec> from_proto = ValidateProtoJobSpec(p);
  ASSERT_TRUE(from_proto.ok()) << from_proto.status().ToString();
  EXPECT_EQ(*from_proto, *from_yaml);
  EXPECT_EQ(from_proto->parallelism.cp_comm_strategy, "allgather");

  // Nothing but data.train: every other field is the default of a YAML spec that says only that.
  v1::JobSpec bare;
  bare.mutable_data()->set_train("/data/tiny.txt");
  StatusOr<JobSpec> minimal = ValidateProtoJobSpec(bare);
  ASSERT_TRUE(minimal.ok()) << minimal.status().ToString();
  StatusOr<JobSpec> minimal_yaml = ParseJobSpecYaml("data: {train: /data/tiny.txt}\n", {});
  ASSERT_TRUE(minimal_yaml.ok()) << minimal_yaml.status().ToString();
  EXPECT_EQ(*minimal, *minimal_yaml);

  // The stored spec has every field set, so the coordinator and the ranks read resolved values.
  const v1::JobSpec stored = ResolvedJobSpecProto(bare, *minimal);
  EXPECT_EQ(stored.train().steps(), JobSpec().train.steps);
  EXPECT_EQ(stored.parallelism().cp_comm_strategy(), "allgather");
  EXPECT_TRUE(stored.restart().has_max_restarts());
  StatusOr<JobSpec> again = JobSpecFromProto(stored);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *minimal);
}

// Every field of the schema (ForEachJobSpecField, the table the YAML parser walks) exists in
// the proto under the same section and key, with presence, and setting it alone through the
// proto changes that field alone: nothing of the YAML schema can be forgotten by the API.
TEST(SpecConvertTest, EveryFieldHasPresenceAndSetsOnlyItself) {
  using google::protobuf::FieldDescriptor;
  JobSpec other;  // a value for every field that differs from its default
  int n = 0;
  ForEachJobSpecField(other, [&](std::string_view, std::string_view, auto& value) {
    using T = std::decay_t<decltype(value)>;
    ++n;
    if constexpr (std::is_same_v<T, std::string>) {
      value = "x" + std::to_string(n);
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      value = {n, n + 1};  // a list (parallelism.pp_layers)
    } else if constexpr (std::is_same_v<T, bool>) {
      value = !value;
    } else {
      value = value + static_cast<T>(n);
    }
  });
  const JobSpec defaults;
  int fields = 0;
  ForEachJobSpecField(
      other, [&](std::string_view section, std::string_view key, const auto& value) {
        ++fields;
        const std::string path =
            section.empty() ? std::string(key) : std::string(section) + "." + std::string(key);
        v1::JobSpec p;
        google::protobuf::Message* msg = &p;
        if (!section.empty()) {
          const FieldDescriptor* sf = p.GetDescriptor()->FindFieldByName(std::string(section));
          ASSERT_NE(sf, nullptr) << "no section " << section << " in meshrun.v1.JobSpec";
          msg = p.GetReflection()->MutableMessage(&p, sf);
        }
        // model.rope_scaling.factor (a YAML group) is the proto's rope_scaling_factor.
        std::string name(key);
        for (char& ch : name) ch = ch == '.' ? '_' : ch;
        const FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(name);
        ASSERT_NE(f, nullptr) << path << " is not in the proto";
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::vector<int>>) {
          EXPECT_TRUE(f->is_repeated()) << path << " is a list: `repeated` (empty = null)";
        } else {
          EXPECT_TRUE(f->has_presence()) << path << " must be `optional` so that unset is not 0";
        }
        const auto* r = msg->GetReflection();
        if constexpr (std::is_same_v<T, std::string>) {
          r->SetString(msg, f, value);
        } else if constexpr (std::is_same_v<T, std::vector<int>>) {
          for (int v : value) r->AddInt32(msg, f, v);
        } else if constexpr (std::is_same_v<T, bool>) {
          r->SetBool(msg, f, value);
        } else if constexpr (std::is_floating_point_v<T>) {
          r->SetDouble(msg, f, value);
        } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
          r->SetInt64(msg, f, value);
        } else {
          r->SetInt32(msg, f, static_cast<int32_t>(value));
        }
        StatusOr<JobSpec> got = JobSpecFromProto(p);
        ASSERT_TRUE(got.ok()) << path << ": " << got.status().ToString();
        JobSpec want = defaults;
        ForEachJobSpecField(want, [&](std::string_view s2, std::string_view k2, auto& member) {
          if constexpr (std::is_same_v<std::decay_t<decltype(member)>, T>) {
            if (s2 == section && k2 == key) member = value;
          }
        });
        if (section == "model" && key == "init_from") {
          // Sizes then come from config.json: placeholders until the engine reads them.
          want.model.n_layer = got->model.n_layer;
          want.model.n_head = got->model.n_head;
          want.model.d_model = got->model.d_model;
          want.model.seq_len = got->model.seq_len;
          want.model.vocab_size = got->model.vocab_size;
        }
        EXPECT_EQ(*got, want) << "setting only " << path;
      });
  EXPECT_GT(fields, 30);
}

TEST(SpecConvertTest, ZeroValuesThatAreSetAreKept) {
  v1::JobSpec p = testing::SpecProto(1, 1, 1, 1);
  p.mutable_train()->set_grad_clip(0);
  p.mutable_train()->set_warmup_steps(0);
  p.mutable_train()->set_weight_decay(0);
  p.mutable_train()->set_min_lr(0);
  p.mutable_train()->set_seed(0);
  StatusOr<JobSpec> s = ValidateProtoJobSpec(p);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->train.grad_clip, 0);
  EXPECT_EQ(s->train.warmup_steps, 0);
  EXPECT_EQ(s->train.weight_decay, 0);
  EXPECT_EQ(s->train.min_lr, 0);
  EXPECT_EQ(s->train.seed, 0);
}

}  // namespace
}  // namespace meshrun::coordinator
