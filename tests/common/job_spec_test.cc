// ValidateJobSpec: the documented defaults, one case per rule (ranges, enums and the mesh rules
// of docs/job-spec.md), and the shape of every message: `<field>: <what> (hint: <fix>)`.
#include "common/job_spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <regex>

namespace meshrun {
namespace {

JobSpec ValidSpec() {
  JobSpec spec;
  spec.data.train = "/data/train.txt";
  return spec;
}

TEST(JobSpecTest, DefaultsAreTheDocumentedOnes) {
  const JobSpec s;
  EXPECT_EQ(s.name, "job");
  EXPECT_EQ(s.model.arch, "gpt2");
  EXPECT_EQ(s.model.n_layer, 2);
  EXPECT_EQ(s.model.n_head, 4);
  EXPECT_EQ(s.model.d_model, 64);
  EXPECT_EQ(s.model.seq_len, 64);
  EXPECT_EQ(s.model.vocab_size, 256);
  EXPECT_EQ(s.model.init_from, "");
  EXPECT_EQ(s.parallelism.dp_replicate_size, 1);
  EXPECT_EQ(s.parallelism.dp_shard_size, 1);
  EXPECT_EQ(s.parallelism.cp_size, 1);
  EXPECT_EQ(s.parallelism.tp_size, 1);
  EXPECT_EQ(s.parallelism.cp_comm_strategy, "allgather");
  EXPECT_EQ(s.train.steps, 20);
  EXPECT_EQ(s.train.global_batch_size, 8);
  EXPECT_EQ(s.train.micro_batch_size, 2);
  EXPECT_DOUBLE_EQ(s.train.lr, 3e-4);
  EXPECT_DOUBLE_EQ(s.train.min_lr, 3e-5);
  EXPECT_EQ(s.train.warmup_steps, 2);
  EXPECT_DOUBLE_EQ(s.train.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(s.train.grad_clip, 1.0);
  EXPECT_DOUBLE_EQ(s.train.beta1, 0.9);
  EXPECT_DOUBLE_EQ(s.train.beta2, 0.95);
  EXPECT_DOUBLE_EQ(s.train.eps, 1e-8);
  EXPECT_EQ(s.train.seed, 1337);
  EXPECT_EQ(s.train.precision, "fp32");
  EXPECT_EQ(s.data.train, "");
  EXPECT_EQ(s.data.val, "");
  EXPECT_EQ(s.data.format, "auto");
  EXPECT_EQ(s.data.order, "sequential");
  EXPECT_EQ(s.data.eval_every, 0);
  EXPECT_EQ(s.checkpoint.dir, "");
  EXPECT_EQ(s.checkpoint.every, 0);
  EXPECT_EQ(s.checkpoint.keep, 2);
  EXPECT_EQ(s.checkpoint.resume, "auto");
  EXPECT_EQ(s.resources.device, "cpu");
  EXPECT_EQ(s.resources.threads, 0);
  EXPECT_EQ(s.restart.max_restarts, 0);
}

TEST(JobSpecTest, DefaultsWithTrainDataAreValid) {
  EXPECT_TRUE(ValidateJobSpec(ValidSpec()).ok());
  EXPECT_TRUE(ValidateJobSpec(ValidSpec(), 1).ok());
}

TEST(JobSpecTest, SchemaListsEverySectionAndKey) {
  EXPECT_EQ(JobSpecSections(), (std::vector<std::string>{"model", "parallelism", "train", "data",
                                                         "checkpoint", "resources", "restart"}));
  EXPECT_EQ(JobSpecKeys(""), (std::vector<std::string>{"name"}));
  EXPECT_EQ(JobSpecKeys("parallelism"),
            (std::vector<std::string>{"dp_replicate_size", "dp_shard_size", "cp_size", "tp_size",
                                      "cp_comm_strategy", "fsdp_reshard_after_forward",
                                      "comm_timeout_seconds", "auto", "pp_size", "pp_schedule",
                                      "pp_virtual_stages", "pp_layers"}));
  EXPECT_TRUE(JobSpecKeys("nope").empty());
  EXPECT_EQ(AllowedValues("data", "format"),
            (std::vector<std::string>{"auto", "text", "llmc", "nanogpt"}));
  EXPECT_TRUE(AllowedValues("data", "train").empty());
}

struct RuleCase {
  const char* name;
  std::function<void(JobSpec&)> mutate;
  std::string path;      // the field the message must start with
  std::string contains;  // a piece of the message (values)
  int nproc = 0;
};

void PrintTo(const RuleCase& c, std::ostream* os) {
  *os << c.name;
}

class JobSpecRuleTest : public ::testing::TestWithParam<RuleCase> {};

TEST_P(JobSpecRuleTest, RejectsWithFieldValuesAndHint) {
  const RuleCase& c = GetParam();
  JobSpec spec = ValidSpec();
  c.mutate(spec);
  const Status status = ValidateJobSpec(spec, c.nproc);
  ASSERT_FALSE(status.ok()) << c.name;
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  const std::string& message = status.message();
  EXPECT_EQ(message.rfind(c.path + ": ", 0), 0u) << message;
  EXPECT_NE(message.find(c.contains), std::string::npos) << message;
  EXPECT_TRUE(std::regex_match(message, std::regex(R"(^[a-z0-9_.]+: .+ \(hint: .+\)$)")))
      << message;
}

const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kInfinity = std::numeric_limits<double>::infinity();

// clang-format off
const RuleCase kRuleCases[] = {
    {"name_empty", [](JobSpec& s) { s.name = ""; }, "name", "not a valid job name"},
    {"name_spaces", [](JobSpec& s) { s.name = "my job"; }, "name", "'my job'"},
    {"arch", [](JobSpec& s) { s.model.arch = "mamba"; }, "model.arch", "'mamba' is not one of 'gpt2', 'llama' or 'gemma'"},
    {"n_layer_zero", [](JobSpec& s) { s.model.n_layer = 0; }, "model.n_layer", "got 0"},
    {"n_head_zero", [](JobSpec& s) { s.model.n_head = 0; }, "model.n_head", "got 0"},
    {"d_model_negative", [](JobSpec& s) { s.model.d_model = -64; }, "model.d_model", "got -64"},
    {"seq_len_zero", [](JobSpec& s) { s.model.seq_len = 0; }, "model.seq_len", "got 0"},
    {"vocab_zero", [](JobSpec& s) { s.model.vocab_size = 0; }, "model.vocab_size", "got 0"},
    {"init_from_control", [](JobSpec& s) { s.model.init_from = "a\tb"; }, "model.init_from", "control"},
    {"dp_replicate_zero", [](JobSpec& s) { s.parallelism.dp_replicate_size = 0; }, "parallelism.dp_replicate_size", "got 0"},
    {"dp_shard_negative", [](JobSpec& s) { s.parallelism.dp_shard_size = -1; }, "parallelism.dp_shard_size", "got -1"},
    {"cp_zero", [](JobSpec& s) { s.parallelism.cp_size = 0; }, "parallelism.cp_size", "got 0"},
    {"tp_negative", [](JobSpec& s) { s.parallelism.tp_size = -1; }, "parallelism.tp_size", "got -1"},
    {"world_too_large", [](JobSpec& s) { s.parallelism.dp_replicate_size = 2048; s.parallelism.dp_shard_size = 2048; }, "parallelism", "largest supported world size"},
    {"cp_comm_strategy", [](JobSpec& s) { s.parallelism.cp_comm_strategy = "p2p"; }, "parallelism.cp_comm_strategy", "'allgather' or 'ring'"},
    {"steps_zero", [](JobSpec& s) { s.train.steps = 0; }, "train.steps", "got 0"},
    {"global_batch_zero", [](JobSpec& s) { s.train.global_batch_size = 0; }, "train.global_batch_size", "got 0"},
    {"micro_batch_zero", [](JobSpec& s) { s.train.micro_batch_size = 0; }, "train.micro_batch_size", "got 0"},
    {"lr_negative", [](JobSpec& s) { s.train.lr = -1e-3; }, "train.lr", "got -0.001"},
    {"lr_nan", [](JobSpec& s) { s.train.lr = kNan; }, "train.lr", "finite"},
    {"lr_infinite", [](JobSpec& s) { s.train.lr = kInfinity; }, "train.lr", "finite"},
    {"min_lr_negative", [](JobSpec& s) { s.train.min_lr = -1; }, "train.min_lr", "got -1"},
    {"min_lr_above_lr", [](JobSpec& s) { s.train.min_lr = 1e-3; }, "train.min_lr", "0.001 is larger than train.lr(0.0003)"},
    {"warmup_negative", [](JobSpec& s) { s.train.warmup_steps = -1; }, "train.warmup_steps", "got -1"},
    {"warmup_above_steps", [](JobSpec& s) { s.train.warmup_steps = 21; }, "train.warmup_steps", "21 is more than train.steps(20)"},
    {"weight_decay_negative", [](JobSpec& s) { s.train.weight_decay = -0.1; }, "train.weight_decay", "got -0.1"},
    {"grad_clip_negative", [](JobSpec& s) { s.train.grad_clip = -1; }, "train.grad_clip", "got -1"},
    {"beta1_one", [](JobSpec& s) { s.train.beta1 = 1.0; }, "train.beta1", "[0, 1), got 1"},
    {"beta2_negative", [](JobSpec& s) { s.train.beta2 = -0.5; }, "train.beta2", "got -0.5"},
    {"eps_zero", [](JobSpec& s) { s.train.eps = 0; }, "train.eps", "(0, inf), got 0"},
    {"seed_negative", [](JobSpec& s) { s.train.seed = -5; }, "train.seed", "got -5"},
    {"precision", [](JobSpec& s) { s.train.precision = "fp16"; }, "train.precision", "'fp32' or 'bf16'"},
    {"bf16_on_cpu", [](JobSpec& s) { s.train.precision = "bf16"; }, "train.precision", "needs resources.device: cuda"},
    {"train_missing", [](JobSpec& s) { s.data.train = ""; }, "data.train", "required field is missing"},
    {"train_invalid_utf8", [](JobSpec& s) { s.data.train = "a\xff"; }, "data.train", "invalid UTF-8"},
    // U+FFFF: yaml-cpp reads it back as U+FFFD (found by fuzz/set_override).
    {"checkpoint_dir_noncharacter", [](JobSpec& s) { s.checkpoint.dir = "/ckpt/\xef\xbf\xbf"; }, "checkpoint.dir", "invalid UTF-8"},
    {"checkpoint_dir_noncharacter_fdd0", [](JobSpec& s) { s.checkpoint.dir = "/ckpt/\xef\xb7\x90"; }, "checkpoint.dir", "invalid UTF-8"},
    {"format", [](JobSpec& s) { s.data.format = "csv"; }, "data.format", "'auto', 'text', 'llmc' or 'nanogpt'"},
    {"order", [](JobSpec& s) { s.data.order = "random"; }, "data.order", "'sequential' or 'shuffled'"},
    {"eval_every_negative", [](JobSpec& s) { s.data.eval_every = -1; }, "data.eval_every", "got -1"},
    {"eval_without_val", [](JobSpec& s) { s.data.eval_every = 5; }, "data.eval_every", "data.val is empty"},
    {"text_vocab_too_small", [](JobSpec& s) { s.data.format = "text"; s.model.vocab_size = 100; }, "model.vocab_size", "100 is smaller than the 256"},
    {"checkpoint_every_negative", [](JobSpec& s) { s.checkpoint.every = -1; }, "checkpoint.every", "got -1"},
    {"checkpoint_keep_zero", [](JobSpec& s) { s.checkpoint.keep = 0; }, "checkpoint.keep", "got 0"},
    {"resume", [](JobSpec& s) { s.checkpoint.resume = "always"; }, "checkpoint.resume", "'auto' or 'never'"},
    {"device", [](JobSpec& s) { s.resources.device = "tpu"; }, "resources.device", "'cpu' or 'cuda'"},
    {"threads_negative", [](JobSpec& s) { s.resources.threads = -2; }, "resources.threads", "got -2"},
    {"max_restarts_negative", [](JobSpec& s) { s.restart.max_restarts = -1; }, "restart.max_restarts", "got -1"},
    {"threads_over_limit", [](JobSpec& s) { s.resources.threads = 2147483647; }, "resources.threads", "2147483647 is over the limit of 1024"},
    {"max_restarts_over_limit", [](JobSpec& s) { s.restart.max_restarts = 1000000; }, "restart.max_restarts", "1000000 is over the limit of 100"},
    // The mesh rules of docs/job-spec.md.
    {"n_head_by_tp", [](JobSpec& s) { s.model.n_head = 6; s.model.d_model = 96; s.parallelism.tp_size = 4; }, "parallelism.tp_size", "model.n_head(6) is not divisible by tp_size(4)"},
    {"mlp_by_tp", [](JobSpec& s) { s.model.n_head = 3; s.parallelism.tp_size = 3; }, "parallelism.tp_size", "4·model.d_model(256) is not divisible by tp_size(3)"},
    {"d_model_by_n_head", [](JobSpec& s) { s.model.d_model = 66; }, "model.d_model", "66 is not divisible by model.n_head(4)"},
    {"seq_len_by_2cp", [](JobSpec& s) { s.model.seq_len = 100; s.parallelism.cp_size = 4; }, "model.seq_len", "100 is not divisible by 2·cp_size(4) = 8"},
    {"batch_by_dp_micro", [](JobSpec& s) { s.train.global_batch_size = 10; s.parallelism.dp_shard_size = 2; }, "train.global_batch_size", "10 is not divisible by dp_replicate_size(1)·dp_shard_size(2)·micro_batch_size(2) = 4"},
    {"batch_by_replicas", [](JobSpec& s) { s.parallelism.dp_replicate_size = 3; }, "train.global_batch_size", "dp_replicate_size(3)"},
    {"world_vs_nproc", [](JobSpec& s) { s.parallelism.tp_size = 2; s.parallelism.dp_shard_size = 2; }, "parallelism", "= world size 4 but --nproc is 8", 8},
};
// clang-format on

INSTANTIATE_TEST_SUITE_P(AllRules, JobSpecRuleTest, ::testing::ValuesIn(kRuleCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(JobSpecTest, TpMessageIsTheDocumentedOne) {
  JobSpec spec = ValidSpec();
  spec.model.n_head = 6;
  spec.model.d_model = 96;
  spec.parallelism.tp_size = 4;
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "parallelism.tp_size: model.n_head(6) is not divisible by tp_size(4) (hint: use a "
            "tp_size that divides 6, such as 2 or 3)");
}

TEST(JobSpecTest, HintsSuggestValuesThatPass) {
  JobSpec spec = ValidSpec();
  spec.train.global_batch_size = 10;
  spec.parallelism.dp_shard_size = 2;
  const std::string message = ValidateJobSpec(spec).message();
  EXPECT_NE(message.find("a multiple of 4, such as 8 or 12"), std::string::npos) << message;
  EXPECT_NE(message.find("micro_batch_size that divides 5, such as 1 or 5"), std::string::npos)
      << message;

  spec = ValidSpec();
  spec.model.seq_len = 100;
  spec.parallelism.cp_size = 4;
  const std::string cp_message = ValidateJobSpec(spec).message();
  EXPECT_NE(cp_message.find("such as 96 or 104"), std::string::npos) << cp_message;
  EXPECT_NE(cp_message.find("cp_size c with 2·c dividing 100, such as 2 or 5"), std::string::npos)
      << cp_message;
}

TEST(JobSpecTest, AcceptsEveryCombinationThatDividesTheModelAndBatch) {
  // Pure replication with tp or cp is allowed (unlike Accelerate), as are all four axes.
  const std::vector<std::array<int, 4>> meshes = {{2, 1, 1, 2}, {2, 1, 2, 1}, {1, 2, 1, 2},
                                                  {1, 1, 4, 1}, {2, 2, 2, 2}, {1, 1, 1, 4}};
  for (const auto& [r, s, c, t] : meshes) {
    JobSpec spec = ValidSpec();
    spec.parallelism = ParallelismSpec{};
    spec.parallelism.dp_replicate_size = r;
    spec.parallelism.dp_shard_size = s;
    spec.parallelism.cp_size = c;
    spec.parallelism.tp_size = t;
    spec.parallelism.cp_comm_strategy = "ring";
    spec.train.global_batch_size = 16;
    spec.train.micro_batch_size = 2;
    EXPECT_TRUE(ValidateJobSpec(spec, r * s * c * t).ok())
        << r << s << c << t << ": " << ValidateJobSpec(spec).message();
  }
}

TEST(JobSpecTest, WarmupMayEqualStepsAndRatesMayBeZero) {
  JobSpec spec = ValidSpec();
  spec.train.warmup_steps = spec.train.steps;
  spec.train.lr = 0;
  spec.train.min_lr = 0;
  spec.train.grad_clip = 0;
  spec.train.weight_decay = 0;
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).message();
}

TEST(JobSpecTest, MeshOfUsesTheParallelismSizes) {
  JobSpec spec = ValidSpec();
  spec.parallelism = ParallelismSpec{};
  spec.parallelism.dp_replicate_size = 2;
  spec.parallelism.dp_shard_size = 3;
  spec.parallelism.tp_size = 4;
  StatusOr<ParallelDims> mesh = MeshOf(spec);
  ASSERT_TRUE(mesh.ok());
  EXPECT_EQ(mesh->world_size(), 24);
  EXPECT_EQ(mesh->dp_shard(), 3);
  spec.parallelism.cp_size = 0;
  EXPECT_FALSE(MeshOf(spec).ok());
}

}  // namespace
}  // namespace meshrun
