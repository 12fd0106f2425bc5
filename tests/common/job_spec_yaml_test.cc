// The job spec's YAML reader and writer: docs/job-spec.md as written, defaults, --set overrides,
// round trips, and the exact wording (field, line, hint) of every kind of error.
#include "common/job_spec_yaml.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace meshrun {
namespace {

// A complete spec in flow style, every section given (dp_shard 2 × tp 2).
constexpr const char* kConventionsExample = R"(name: tiny-demo
model:       {arch: gpt2, n_layer: 2, n_head: 4, d_model: 64, seq_len: 64, vocab_size: 256}  # init_from: DIR
parallelism: {dp_replicate_size: 1, dp_shard_size: 2, cp_size: 1, tp_size: 2, cp_comm_strategy: allgather}  # or ring
train:       {steps: 20, global_batch_size: 8, micro_batch_size: 2, lr: 3.0e-4, min_lr: 3.0e-5,
              warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0, beta1: 0.9, beta2: 0.95,
              eps: 1.0e-8, seed: 1337, precision: fp32}     # precision bf16 on cuda
data:        {train: /data/train.txt, val: /data/val.txt, format: auto, order: sequential, eval_every: 0}
checkpoint:  {dir: /tmp/ckpt, every: 0, keep: 2, resume: auto}
resources:   {device: cpu}                                  # or cuda
restart:     {max_restarts: 0}
)";

// Line numbers in the error tests below refer to this text.
constexpr const char* kBlockSpec = R"(name: blocks
model:
  n_head: 4
parallelism:
  tp_size: 2
train:
  steps: 20
data:
  train: /data/train.txt
)";

std::string ErrorOf(const std::string& text, const std::vector<std::string>& overrides = {}) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(text, overrides, "job.yaml");
  if (spec.ok()) return "OK";
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << spec.status().ToString();
  return spec.status().message();
}

JobSpec MustParse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  StatusOr<JobSpec> spec = ParseJobSpecYaml(text, overrides);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return spec.ok() ? *spec : JobSpec{};
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

TEST(JobSpecYamlTest, ParsesTheConventionsExample) {
  const JobSpec spec = MustParse(kConventionsExample);
  JobSpec expected;
  expected.name = "tiny-demo";
  expected.parallelism.dp_shard_size = 2;
  expected.parallelism.tp_size = 2;
  expected.data.train = "/data/train.txt";
  expected.data.val = "/data/val.txt";
  expected.checkpoint.dir = "/tmp/ckpt";
  EXPECT_EQ(spec, expected);
}

TEST(JobSpecYamlTest, MissingFieldsTakeTheirDefaults) {
  JobSpec expected;
  expected.data.train = "t.txt";
  EXPECT_EQ(MustParse("data: {train: t.txt}\n"), expected);
  EXPECT_EQ(MustParse("data:\n  train: t.txt\nmodel:\ntrain: {}\n"), expected);
}

TEST(JobSpecYamlTest, TheExamplesValidate) {
  const char* dir = std::getenv("MESHRUN_SOURCE_DIR");
  const std::string root = dir ? std::string(dir) + "/" : std::string();
  StatusOr<JobSpec> tiny = LoadJobSpecFile(root + "examples/tiny.yaml", {});
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  EXPECT_EQ(tiny->name, "tiny");
  EXPECT_EQ(tiny->model.d_model, 64);
  EXPECT_EQ(tiny->data.format, "text");
  EXPECT_EQ(tiny->checkpoint.every, 10);
  EXPECT_DOUBLE_EQ(tiny->train.lr, 1e-3);
  StatusOr<JobSpec> mini = LoadJobSpecFile(root + "examples/mini.yaml", {});
  ASSERT_TRUE(mini.ok()) << mini.status().ToString();
  EXPECT_EQ(mini->name, "mini");
  EXPECT_EQ(mini->model.d_model, 256);
  EXPECT_EQ(mini->model.n_layer, 4);
  EXPECT_EQ(mini->train.micro_batch_size, 4);
  EXPECT_EQ(mini->checkpoint.dir, "/tmp/meshrun/mini/checkpoints");
}

TEST(JobSpecYamlTest, OverridesApplyInOrderBeforeValidation) {
  const JobSpec spec = MustParse(
      kBlockSpec, {"parallelism.tp_size=4", "train.lr=1e-3", "name=renamed", "data.val=v.txt",
                   "resources.device=cuda", "parallelism.tp_size=1", "checkpoint.dir="});
  EXPECT_EQ(spec.parallelism.tp_size, 1);  // the later --set wins
  EXPECT_DOUBLE_EQ(spec.train.lr, 1e-3);
  EXPECT_EQ(spec.name, "renamed");
  EXPECT_EQ(spec.data.val, "v.txt");         // section present, key absent in the file
  EXPECT_EQ(spec.resources.device, "cuda");  // section absent in the file
  EXPECT_EQ(spec.checkpoint.dir, "");
  // An override can make an invalid file valid, and a whole section can be set.
  EXPECT_TRUE(ParseJobSpecYaml("data: {train: a}\ntrain: {steps: 0}\n", {"train.steps=5"}).ok());
  EXPECT_EQ(MustParse(kBlockSpec, {"model={n_layer: 3, n_head: 8}"}).model.n_layer, 3);
  // Values containing '=' keep everything after the first one.
  EXPECT_EQ(MustParse(kBlockSpec, {"data.train=/a=b"}).data.train, "/a=b");
}

TEST(JobSpecYamlTest, OverrideErrorsNameTheOverride) {
  EXPECT_EQ(ErrorOf(kBlockSpec, {"parallelism.tp_sz=2"}),
            "--set parallelism.tp_sz: unknown field (hint: did you mean 'tp_size'?)");
  EXPECT_EQ(ErrorOf(kBlockSpec, {"paralelism.tp_size=2"}),
            "--set paralelism.tp_size: unknown field (hint: did you mean "
            "'parallelism.tp_size'?)");
  EXPECT_EQ(ErrorOf(kBlockSpec, {"tp_size"}),
            "--set tp_size: expected KEY=VALUE (hint: e.g. --set parallelism.tp_size=2)");
  EXPECT_EQ(ErrorOf(kBlockSpec, {"=3"}).rfind("--set =3: expected KEY=VALUE", 0), 0u);
  EXPECT_EQ(ErrorOf(kBlockSpec, {"a.b.c=1"}).rfind("--set a.b.c: unknown field", 0), 0u);
  EXPECT_EQ(ErrorOf(kBlockSpec, {"train.steps=ten"}),
            "train.steps: expected an integer, got 'ten' (from --set) (hint: write a whole "
            "number, e.g. steps: 20)");
  EXPECT_EQ(ErrorOf(kBlockSpec, {"train.lr=["}).rfind("--set train.lr: malformed value '['", 0),
            0u);
  // A rule broken by an override says so instead of pointing at a line.
  EXPECT_EQ(ErrorOf(kBlockSpec, {"parallelism.tp_size=3"}),
            "parallelism.tp_size: model.n_head(4) is not divisible by tp_size(3) (from --set) "
            "(hint: use a tp_size that divides 4, such as 2 or 4)");
}

TEST(JobSpecYamlTest, UnknownFieldsSuggestTheClosestName) {
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "tp_size: 2", "tp_sz: 2")),
            "parallelism.tp_sz: unknown field (line 5) (hint: did you mean 'tp_size'?)");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "model:", "modle:")),
            "modle: unknown field (line 2) (hint: did you mean 'model'?)");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "steps: 20", "tp_size: 2")),
            "train.tp_size: unknown field (line 7) (hint: did you mean 'parallelism.tp_size'? "
            "tp_size belongs under 'parallelism:')");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "  n_head: 4", "  N_HEAD: 4")),
            "model.N_HEAD: unknown field (line 3) (hint: did you mean 'n_head'?)");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "  steps: 20", "  warmup: 2")),
            "train.warmup: unknown field (line 7) (hint: did you mean 'warmup_steps'?)");
  EXPECT_EQ(
      ErrorOf(Replace(kBlockSpec, "n_head: 4", "zzzzzz: 4")),
      "model.zzzzzz: unknown field (line 3) (hint: the fields of model are 'arch', "
      "'n_layer', 'n_head', 'd_model', 'seq_len', 'vocab_size', 'init_from', 'n_kv_head', 'd_ff', "
      "'norm_eps', 'rope_theta', 'rope_scaling', 'tie_embeddings', 'attention_bias', "
      "'sliding_window', 'head_dim')");
}

TEST(JobSpecYamlTest, WrongTypesNameFieldValueAndLine) {
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "steps: 20", "steps: ten")),
            "train.steps: expected an integer, got 'ten' (line 7) (hint: write a whole number, "
            "e.g. steps: 20)");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "steps: 20", "steps: 2.5")),
            "train.steps: expected an integer, got '2.5' (line 7) (hint: write a whole number, "
            "e.g. steps: 20)");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "steps: 20", "lr: fast")),
            "train.lr: expected a number, got 'fast' (line 7) (hint: write a number, e.g. lr: "
            "3.0e-04)");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "steps: 20", "steps: [1, 2]")).substr(0, 50),
            "train.steps: expected an integer, got a list (line");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "steps: 20", "steps:")).substr(0, 48),
            "train.steps: expected an integer, got nothing (l");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "steps: 20", "steps: 99999999999")).substr(0, 58),
            "train.steps: '99999999999' is out of range (line 7) (hint:");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "name: blocks", "name: {a: 1}")).substr(0, 44),
            "name: expected a string, got a mapping (line");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "model:\n  n_head: 4", "model: 5")),
            "model: expected a mapping of fields, got '5' (line 2) (hint: indent the fields "
            "under 'model:', e.g. arch: gpt2)");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "tp_size: 2", "fsdp_reshard_after_forward: yes")),
            "parallelism.fsdp_reshard_after_forward: expected true or false, got 'yes' (line 5) "
            "(hint: write fsdp_reshard_after_forward: true or fsdp_reshard_after_forward: false)");
  EXPECT_FALSE(MustParse(Replace(kBlockSpec, "tp_size: 2", "fsdp_reshard_after_forward: false"))
                   .parallelism.fsdp_reshard_after_forward);
  EXPECT_EQ(ErrorOf(kBlockSpec, {"train.activation_checkpointing=some"}).substr(0, 77),
            "train.activation_checkpointing: 'some' is not one of 'none', 'selective' or '");
  // Quoted numbers and a leading '+' are accepted; numbers in string fields are strings.
  EXPECT_EQ(MustParse(Replace(kBlockSpec, "steps: 20", "steps: \"30\"")).train.steps, 30);
  EXPECT_EQ(MustParse(Replace(kBlockSpec, "steps: 20", "steps: +30")).train.steps, 30);
  EXPECT_EQ(MustParse(Replace(kBlockSpec, "name: blocks", "name: 123")).name, "123");
}

TEST(JobSpecYamlTest, ValidationErrorsPointAtTheLine) {
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "tp_size: 2", "tp_size: 0")),
            "parallelism.tp_size: must be at least 1, got 0 (line 5) (hint: set tp_size to 1 or "
            "more; 1 means no tensor parallelism)");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "tp_size: 2", "tp_size: -1")).substr(0, 58),
            "parallelism.tp_size: must be at least 1, got -1 (line 5) (");
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "tp_size: 2", "tp_size: 3")),
            "parallelism.tp_size: model.n_head(4) is not divisible by tp_size(3) (line 5) "
            "(hint: use a tp_size that divides 4, such as 2 or 4)");
  // A rule about a field the file leaves out has no line to point at.
  EXPECT_EQ(ErrorOf(Replace(kBlockSpec, "  n_head: 4\n", "  n_head: 5\n")).substr(0, 62),
            "parallelism.tp_size: model.n_head(5) is not divisible by tp_si");
  EXPECT_EQ(ErrorOf("name: x\n"),
            "data.train: required field is missing (hint: set data.train to a text file, a "
            "folder of text files or a .bin token file)");
  EXPECT_EQ(ErrorOf(""), ErrorOf("name: x\n"));
}

TEST(JobSpecYamlTest, MalformedYamlNamesSourceAndLine) {
  EXPECT_EQ(ErrorOf("name: x\nmodel:\n  n_layer: 2\n n_head: 4\ndata: {train: a}\n"),
            "job.yaml: malformed YAML at line 4: end of map not found (hint: check the "
            "indentation, colons and quotes around that line)");
  EXPECT_EQ(ErrorOf("name: x\nmodel: {n_layer: 2\ndata:\n  train: a\n").substr(0, 40),
            "job.yaml: malformed YAML at line 3: end ");
  EXPECT_EQ(ErrorOf("name: x\ndata: {train: a}\n---\nname: y\n"),
            "job.yaml: holds more than one YAML document (hint: keep one job spec per file and "
            "remove the '---' separators)");
  // yaml-cpp 0.7 alone would loop, allocating, on a stray ',' at the start of a document.
  EXPECT_EQ(ErrorOf(" ,data: x\n"),
            "job.yaml: malformed YAML at line 1: unexpected ',' (hint: check the indentation, "
            "colons and quotes around that line)");
  EXPECT_EQ(ErrorOf("data: {train: a}\n---\n,\n").rfind("job.yaml: holds more than one", 0), 0u);
  EXPECT_EQ(ErrorOf("- a\n- b\n").substr(0, 69),
            "job.yaml: expected a mapping of fields at the top level, got a list (");
  EXPECT_EQ(ErrorOf("data: {train: a}\ntrain:\n  steps: 20\n  steps: 30\n"),
            "train.steps: duplicate field (line 4) (hint: remove this one or the one on line 3)");
  EXPECT_EQ(ErrorOf("data: {train: a}\n? [a]\n: 1\n").substr(0, 47),
            "job.yaml: expected a field name, got a list (li");
}

TEST(JobSpecYamlTest, LoadJobSpecFileReportsUnreadableFiles) {
  StatusOr<JobSpec> missing = LoadJobSpecFile("/nonexistent/job.yaml", {});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message().rfind("/nonexistent/job.yaml: cannot read the job spec", 0),
            0u);
  StatusOr<JobSpec> directory = LoadJobSpecFile("/tmp", {});
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("is a directory"), std::string::npos);

  const std::string path = ::testing::TempDir() + "/job_spec_yaml_test_bad.yaml";
  std::ofstream(path) << "data: {train: a}\nmodel: {n_layer: [\n";
  StatusOr<JobSpec> bad = LoadJobSpecFile(path, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind(path + ": malformed YAML at line ", 0), 0u)
      << bad.status().message();
}

TEST(JobSpecYamlTest, RoundTripsEveryField) {
  std::vector<JobSpec> specs;
  specs.push_back(MustParse(kConventionsExample));
  JobSpec odd = MustParse(kBlockSpec);
  odd.name = "a.b_c-1";
  odd.model.init_from = "/models/gpt2 small";
  odd.data.train = "null";
  odd.data.val = "~";
  odd.checkpoint.dir = "données/#1: 'x' \"y\"";
  odd.train.lr = 1.0 / 3.0;
  odd.train.min_lr = 1e-300;
  odd.train.eps = 5e-324;  // the smallest denormal
  odd.train.beta1 = 0.0;
  odd.train.beta2 = 0.999999999999;
  odd.train.grad_clip = 123456789.125;
  odd.train.seed = 9007199254740993;  // not representable as a double
  odd.model.vocab_size = 50257;
  odd.resources.threads = kMaxThreads;  // the largest a spec may ask for
  odd.parallelism.fsdp_reshard_after_forward = false;
  odd.train.activation_checkpointing = "selective";
  specs.push_back(odd);
  for (const char* value : {"yes", "true", "123", "1e3", "-", "a: b", " lead", "trail ", "[x]"}) {
    JobSpec s = MustParse(kBlockSpec);
    s.data.val = value;
    specs.push_back(s);
  }
  for (const JobSpec& spec : specs) {
    ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec).message();
    const std::string yaml = JobSpecToYaml(spec);
    StatusOr<JobSpec> again = ParseJobSpecYaml(yaml, {});
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << yaml;
    EXPECT_EQ(*again, spec) << yaml;
    EXPECT_EQ(JobSpecToYaml(*again), yaml);
  }
}

TEST(JobSpecYamlTest, WritesEveryFieldInSpecOrderAndFloatsAsFloats) {
  const std::string yaml = JobSpecToYaml(MustParse(kConventionsExample));
  EXPECT_EQ(yaml.rfind("name: tiny-demo\nmodel:\n  arch: gpt2\n", 0), 0u) << yaml;
  EXPECT_NE(yaml.find("\n  grad_clip: 1.0\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("\n  eps: 1.0e-08\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("\n  init_from: \"\"\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("\nrestart:\n  max_restarts: 0\n"), std::string::npos) << yaml;
}

// docs/job-spec.md: with model.init_from, model fields the spec leaves out come from the
// folder's config.json; fields the spec (or --set) gives are kept.
TEST(JobSpecYamlTest, InitFromFillsLeftOutModelFieldsFromConfigJson) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("meshrun_init_from_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "hf");
  std::ofstream(dir / "hf/config.json")
      << R"({"n_embd": 96, "n_layer": 3, "n_head": 6, "n_positions": 128, "vocab_size": 300})";
  std::ofstream(dir / "job.yaml") << "model: {init_from: " << (dir / "hf").string()
                                  << ", n_layer: 2}\ndata: {train: /tmp/x}\n";
  StatusOr<JobSpec> spec = LoadJobSpecFile((dir / "job.yaml").string(), {"model.n_head=3"});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->model.d_model, 96);
  EXPECT_EQ(spec->model.seq_len, 128);
  EXPECT_EQ(spec->model.vocab_size, 300);
  EXPECT_EQ(spec->model.n_layer, 2);  // given by the spec
  EXPECT_EQ(spec->model.n_head, 3);   // given by --set
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace meshrun
