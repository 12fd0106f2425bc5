// N-D parallel equivalence (docs/parallelism.md): every mesh trains the model one rank trains.
// Runs `meshrun train --nproc N` as real processes over Gloo on loopback, 6 steps of the tiny
// example each, and checks against the single-rank run: the loss at every step and the final
// parameters within 1e-4 relative; the measured bus bytes per axis against the formulas of
// docs/parallelism.md; resharding a checkpoint into other meshes; a SIGKILLed rank ending the run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/job_spec_yaml.h"
#include "engine/io/checkpoint.h"
#include "engine/train/comm_volume.h"
#include "engine/train/memory_model.h"
#include "tests/client/cli_runner.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Mesh {
  int R = 1, S = 1, C = 1, T = 1;
  std::string cp_strategy = "allgather";
  std::string recompute = "none";  // train.activation_checkpointing
  bool reshard = true;             // parallelism.fsdp_reshard_after_forward
  int world() const { return R * S * C * T; }
  std::string Name() const {
    return "R" + std::to_string(R) + "S" + std::to_string(S) + "C" + std::to_string(C) + "T" +
           std::to_string(T) + (C > 1 ? "-" + cp_strategy : "") +
           (recompute != "none" ? "-ac-" + recompute : "") + (reshard ? "" : "-keep");
  }
  std::vector<std::string> Sets() const {
    return {"--set",
            "parallelism.dp_replicate_size=" + std::to_string(R),
            "--set",
            "parallelism.dp_shard_size=" + std::to_string(S),
            "--set",
            "parallelism.cp_size=" + std::to_string(C),
            "--set",
            "parallelism.tp_size=" + std::to_string(T),
            "--set",
            "parallelism.cp_comm_strategy=" + cp_strategy,
            "--set",
            "train.activation_checkpointing=" + recompute,
            "--set",
            std::string("parallelism.fsdp_reshard_after_forward=") + (reshard ? "true" : "false")};
  }
};

struct RunResult {
  testing::CliResult cli;
  std::vector<double> losses;
  std::vector<double> grad_norms;
  json summary;
};

class ParallelTest : public ::testing::Test {
 protected:
  // One temp dir for the whole program (the baseline run is shared by both suites).
  static void SetUpTestSuite() {
    if (temp_ != nullptr) return;
    char pattern[] = "/tmp/meshrun_parallel_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    temp_ = new fs::path(pattern);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(*temp_, ec);
    });
  }

  static fs::path Binary() { return fs::path(std::getenv("MESHRUN_BINARY_DIR")) / "bin/meshrun"; }
  static fs::path Source() { return fs::path(std::getenv("MESHRUN_SOURCE_DIR")); }

  static std::vector<std::string> BaseArgs(const Mesh& mesh, const std::string& ckpt) {
    std::vector<std::string> args = {"train",
                                     "-f",
                                     (Source() / "examples/tiny.yaml").string(),
                                     "--nproc",
                                     std::to_string(mesh.world()),
                                     "-o",
                                     "json",
                                     "--set",
                                     "train.steps=6",
                                     "--set",
                                     "checkpoint.dir=" + (*temp_ / ckpt).string(),
                                     "--set",
                                     "checkpoint.every=3"};
    for (const std::string& s : mesh.Sets()) args.push_back(s);
    return args;
  }

  static RunResult Train(const Mesh& mesh, const std::string& ckpt,
                         std::vector<std::string> extra = {}) {
    std::vector<std::string> args = BaseArgs(mesh, ckpt);
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r;
    r.cli = testing::RunCli(Binary(), args, *temp_ / (ckpt + ".stderr"), 120);
    for (const std::string& line : testing::Lines(r.cli.out)) {
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;
      if (j["event"] == "step") {
        r.losses.push_back(j["loss"]);
        r.grad_norms.push_back(j["grad_norm"]);
      }
      if (j["event"] == "summary") r.summary = j;
    }
    return r;
  }

  // The single-rank run every mesh is compared with (computed once).
  static const RunResult& Baseline() {
    static RunResult* baseline = new RunResult(Train(Mesh{}, "baseline"));
    return *baseline;
  }

  static void ExpectSameParameters(const std::string& ckpt) {
    StatusOr<CheckpointReader> want =
        CheckpointReader::Open((*temp_ / "baseline/step-00000006").string());
    StatusOr<CheckpointReader> got =
        CheckpointReader::Open((*temp_ / ckpt / "step-00000006").string());
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    // All parameters as one vector within 1e-4 relative; each tensor within 1e-3 (a tensor
    // that barely moves from zero, like the q bias, has a norm near float32 noise).
    int compared = 0;
    double total_diff = 0, total_norm = 0;
    for (const auto& [name, shape] : want->metadata().tensors) {
      if (name.rfind("model/", 0) != 0) continue;
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> a(n), b(n);
      ASSERT_TRUE(want->ReadTensor(name, a.data()).ok());
      ASSERT_TRUE(got->ReadTensor(name, b.data()).ok()) << name;
      double diff = 0, norm = 0;
      for (int64_t i = 0; i < n; ++i) {
        diff += (a[i] - b[i]) * double(a[i] - b[i]);
        norm += a[i] * double(a[i]);
      }
      EXPECT_LE(std::sqrt(diff), 1e-3 * std::sqrt(norm)) << name;
      total_diff += diff;
      total_norm += norm;
      ++compared;
    }
    EXPECT_LE(std::sqrt(total_diff), 1e-4 * std::sqrt(total_norm));
    EXPECT_GT(compared, 20);
  }

  // A copy of the step-3 checkpoints in `source` resumed under `target`: steps 4–6 have the
  // baseline's losses.
  static void ExpectResumesWithTheBaselineLosses(const std::string& source, const Mesh& target) {
    SCOPED_TRACE(source + " resumed under " + target.Name());
    const std::string dir = source + "-" + target.Name();
    fs::copy(*temp_ / source, *temp_ / dir, fs::copy_options::recursive);
    RunResult r = Train(target, dir);
    ASSERT_EQ(r.cli.exit_code, 0) << r.cli.err;
    EXPECT_NE(r.cli.err.find("resumed from"), std::string::npos) << r.cli.err;
    ASSERT_EQ(r.losses.size(), 3u) << r.cli.out;
    const RunResult& base = Baseline();
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(r.losses[k], base.losses[3 + k], 1e-4 * base.losses[3 + k]) << "step " << k + 4;
    }
  }

  static fs::path* temp_;
};

fs::path* ParallelTest::temp_ = nullptr;

class MeshEquivalence : public ParallelTest, public ::testing::WithParamInterface<Mesh> {};

TEST_P(MeshEquivalence, LossesParametersAndBusBytesMatch) {
  const Mesh mesh = GetParam();
  const RunResult& base = Baseline();
  ASSERT_EQ(base.cli.exit_code, 0) << base.cli.err;
  ASSERT_EQ(base.losses.size(), 6u);
  RunResult r = Train(mesh, mesh.Name());
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.err;
  ASSERT_EQ(r.losses.size(), 6u) << r.cli.out;
  // The loss and the global grad norm of every step (the norm is above train.grad_clip 1.0
  // in the first steps of tiny.yaml, so clipping is active and checked too).
  ASSERT_EQ(r.grad_norms.size(), 6u);
  EXPECT_GT(base.grad_norms[0], 1.0) << "clipping must be active in this test";
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_NEAR(r.losses[k], base.losses[k], 1e-4 * base.losses[k]) << "step " << k + 1;
    EXPECT_NEAR(r.grad_norms[k], base.grad_norms[k], 1e-4 * base.grad_norms[k])
        << "grad norm of step " << k + 1;
  }
  ExpectSameParameters(mesh.Name());

  // Bus bytes per axis equal the formulas (docs/parallelism.md).
  std::string yaml = testing::ReadFile(Source() / "examples/tiny.yaml");
  std::vector<std::string> overrides = {"train.steps=6"};
  const std::vector<std::string> sets = mesh.Sets();
  for (size_t i = 1; i < sets.size(); i += 2) overrides.push_back(sets[i]);
  StatusOr<JobSpec> spec = ParseJobSpecYaml(yaml, overrides);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::map<std::string, double> want = ExpectedCommBytesPerStep(*spec);
  for (const auto& [axis, bytes] : want) {
    const double got = r.summary["comm_bytes"][axis];
    EXPECT_NEAR(got, bytes, 1e-9 * std::max(1.0, bytes)) << axis;
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryAxisAndTheirCombinations, MeshEquivalence,
    ::testing::Values(Mesh{2, 1, 1, 1}, Mesh{1, 2, 1, 1}, Mesh{1, 1, 2, 1, "allgather"},
                      Mesh{1, 1, 2, 1, "ring"}, Mesh{1, 1, 1, 2}, Mesh{1, 2, 1, 2},
                      Mesh{2, 2, 1, 1}, Mesh{1, 2, 2, 1}, Mesh{1, 1, 2, 2, "ring"},
                      Mesh{2, 1, 2, 2, "allgather"},
                      // An axis of 4: with two ranks a ring's neighbours are the same
                      // rank, so only four can catch a wrong direction.
                      Mesh{1, 1, 1, 4}, Mesh{1, 4, 1, 1}, Mesh{1, 1, 4, 1, "ring"},
                      // Activation checkpointing and unit residency.
                      Mesh{1, 2, 1, 2, "allgather", "full"}, Mesh{1, 1, 2, 2, "ring", "selective"},
                      Mesh{1, 2, 2, 1, "allgather", "selective"},
                      Mesh{1, 2, 1, 1, "allgather", "none", false}),
    [](const ::testing::TestParamInfo<Mesh>& info) {
      std::string name = info.param.Name();
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

// The Llama family through the same plans: grouped-query attention (n_kv_head 2 of 4), rotary
// embeddings with llama3 scaling, SwiGLU of d_ff 96, an untied head, and a vocabulary of 257
// that tp splits unevenly (129 + 128 rows). Every mesh: the single rank's losses, the comm
// formulas' bytes, and the memory model's figure of every kind (max over ranks).
class LlamaMeshEquivalence : public ParallelTest, public ::testing::WithParamInterface<Mesh> {
 protected:
  // The text of tiny.yaml's data.train as an llm.c token file of its bytes: a vocabulary of
  // 257 is refused for byte-level text (256), not for token files whose ids are below it.
  static std::string TokenFile() {
    static const std::string path = [] {
      const std::string text = testing::ReadFile("/usr/share/games/fortunes/cookie");
      const fs::path out = *temp_ / "cookie-bytes.bin";
      std::ofstream f(out, std::ios::binary);
      int32_t header[256] = {20240520, 1, static_cast<int32_t>(text.size())};
      f.write(reinterpret_cast<const char*>(header), sizeof(header));
      for (unsigned char ch : text) {
        const uint16_t id = ch;
        f.write(reinterpret_cast<const char*>(&id), sizeof(id));
      }
      return out.string();
    }();
    return path;
  }
  static std::vector<std::string> LlamaSets() {
    std::vector<std::string> sets = {"data.train=" + TokenFile(),
                                     "data.val=",
                                     "data.format=auto",
                                     "model.arch=llama",
                                     "model.n_kv_head=2",
                                     "model.d_ff=96",
                                     "model.vocab_size=257",
                                     "model.rope_theta=500000",
                                     "model.rope_scaling.type=llama3",
                                     "model.rope_scaling.original_max_position_embeddings=16"};
    return sets;
  }
  static std::vector<std::string> Extra() {
    std::vector<std::string> extra;
    for (const std::string& s : LlamaSets()) extra.insert(extra.end(), {"--set", s});
    return extra;
  }
  static const RunResult& LlamaBaseline() {
    static RunResult* baseline = new RunResult(Train(Mesh{}, "llama-baseline", Extra()));
    return *baseline;
  }
};

TEST_P(LlamaMeshEquivalence, LossesBusBytesAndMemoryMatch) {
  const Mesh& mesh = GetParam();
  const RunResult& base = LlamaBaseline();
  ASSERT_EQ(base.cli.exit_code, 0) << base.cli.err;
  ASSERT_EQ(base.losses.size(), 6u);
  const RunResult r = Train(mesh, "llama-" + mesh.Name(), Extra());
  ASSERT_EQ(r.cli.exit_code, 0) << r.cli.err;
  ASSERT_EQ(r.losses.size(), 6u) << r.cli.out;
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_NEAR(r.losses[k], base.losses[k], 1e-4 * base.losses[k]) << "step " << k + 1;
  }
  std::vector<std::string> overrides = {"train.steps=6"};
  const std::vector<std::string> sets = mesh.Sets();
  for (size_t i = 1; i < sets.size(); i += 2) overrides.push_back(sets[i]);
  for (const std::string& s : LlamaSets()) overrides.push_back(s);
  StatusOr<JobSpec> spec =
      ParseJobSpecYaml(testing::ReadFile(Source() / "examples/tiny.yaml"), overrides);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  for (const auto& [axis, bytes] : ExpectedCommBytesPerStep(*spec)) {
    EXPECT_NEAR(r.summary["comm_bytes"][axis].get<double>(), bytes, 1e-9 * std::max(1.0, bytes))
        << axis;
  }
  const MemoryPrediction want = PredictRankMemory(*spec);
  const char* kinds[] = {"parameters", "gradients", "optimizer", "activations", "communication"};
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(r.summary["memory"][kinds[k]].get<double>(), static_cast<double>(want.bytes[k]))
        << kinds[k];
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaPlans, LlamaMeshEquivalence,
                         ::testing::Values(Mesh{}, Mesh{1, 1, 1, 2},
                                           Mesh{1, 2, 2, 1, "ring", "selective"},
                                           Mesh{2, 1, 1, 2, "allgather", "full"},
                                           Mesh{1, 2, 2, 2, "allgather"}),
                         [](const ::testing::TestParamInfo<Mesh>& info) {
                           std::string name = info.param.Name();
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST_F(ParallelTest, CheckpointFromOneMeshResumesUnderAnother) {
  const RunResult& base = Baseline();
  ASSERT_EQ(base.cli.exit_code, 0) << base.cli.err;
  // Save at step 3 under dp_shard 2 × tp 2.
  RunResult first = Train(Mesh{1, 2, 1, 2}, "reshard-source", {"--stop-after", "3"});
  ASSERT_EQ(first.cli.exit_code, 0) << first.cli.err;
  ASSERT_TRUE(fs::exists(*temp_ / "reshard-source/step-00000003/metadata.json"));
  for (const Mesh& target : {Mesh{2, 1, 2, 1}, Mesh{}}) {
    ExpectResumesWithTheBaselineLosses("reshard-source", target);
  }
}

TEST_F(ParallelTest, ShardedCheckpointHasAQuarterPerRankAndResumesUnderOtherMeshes) {
  const RunResult& base = Baseline();
  ASSERT_EQ(base.cli.exit_code, 0) << base.cli.err;
  RunResult first = Train(Mesh{1, 4, 1, 1}, "sharded-source", {"--stop-after", "3"});
  ASSERT_EQ(first.cli.exit_code, 0) << first.cli.err;
  const fs::path step = *temp_ / "sharded-source/step-00000003";
  // Every rank wrote its own quarter of the state: four files of about a quarter each.
  std::vector<uintmax_t> sizes;
  uintmax_t total = 0;
  for (int r = 0; r < 4; ++r) {
    const fs::path file = step / ShardFileName(r);
    ASSERT_TRUE(fs::exists(file)) << file;
    sizes.push_back(fs::file_size(file));
    total += sizes.back();
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_GT(sizes[r], total * 0.20) << "rank " << r;
    EXPECT_LT(sizes[r], total * 0.30) << "rank " << r;
  }
  for (const Mesh& target : {Mesh{2, 1, 1, 2}, Mesh{}}) {
    ExpectResumesWithTheBaselineLosses("sharded-source", target);
  }
}

TEST_F(ParallelTest, SigkilledRankEndsTheRunWithAnErrorNamingIt) {
  // Long enough to be mid-run when the kill lands.
  const std::vector<std::string> args = {"train",
                                         "-f",
                                         (Source() / "examples/tiny.yaml").string(),
                                         "--nproc",
                                         "2",
                                         "-o",
                                         "json",
                                         "--set",
                                         "train.steps=100000",
                                         "--set",
                                         "checkpoint.dir=",
                                         "--set",
                                         "parallelism.dp_shard_size=2"};
  const fs::path err = *temp_ / "kill.stderr";
  const fs::path out = *temp_ / "kill.stdout";
  pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    freopen(out.c_str(), "w", stdout);
    freopen(err.c_str(), "w", stderr);
    std::vector<char*> argv = {const_cast<char*>(Binary().c_str())};
    std::string bin = Binary().string();
    argv[0] = bin.data();
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  // Wait for training to be under way, then SIGKILL rank 1.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (testing::ReadFile(out).find("\"step\":3,") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(testing::ReadFile(out).find("\"step\":3,"), std::string::npos)
      << testing::ReadFile(err);
  const std::string pids = [&] {
    testing::CliResult r = testing::RunCli("/usr/bin/pgrep", {"-P", std::to_string(launcher)},
                                           *temp_ / "pgrep.err", 10);
    return r.out;
  }();
  std::vector<std::string> children = testing::Lines(pids);
  ASSERT_EQ(children.size(), 2u) << pids;
  // Children are started in rank order; the second is rank 1.
  const pid_t victim = std::stoi(children[1]);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(launcher, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < killed_at + std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (done == 0) {
    kill(launcher, SIGKILL);
    waitpid(launcher, &status, 0);
    FAIL() << "the run did not end within 20 s of the kill";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string stderr_text = testing::ReadFile(err);
  EXPECT_NE(stderr_text.find("error: rank 1"), std::string::npos) << stderr_text;
  EXPECT_NE(stderr_text.find("SIGKILL"), std::string::npos) << stderr_text;
}

}  // namespace
}  // namespace meshrun
