// meshrun-train: the product's Trainer without the client, for trees built with
// -DMESHRUN_ENGINE_ONLY=ON (no gRPC, no yaml-cpp), e.g. scripts/gpu-check on a GPU machine. The
// spec is the defaults of docs/job-spec.md changed by `--set KEY=VALUE` (the same dotted keys as
// `meshrun train --set`); it prints the `train -o json` step lines and summary on stdout.
// One rank by default; --rank R --world W --store-dir DIR runs one rank of W that meet in a
// FileStore folder (the backend by resources.device: NCCL on cuda). docs/gpu.md describes it.
#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "common/job_spec.h"
#include "engine/comm/backend_factory.h"
#include "engine/comm/store.h"
#include "engine/train/device.h"
#include "engine/train/rank_device.h"
#include "engine/train/trainer.h"

namespace meshrun {
namespace {

int Fail(const Status& s) {
  std::cerr << "error: " << s.message() << std::endl;
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

template <typename T>
bool ParseValue(const std::string& text, T* out) {
  if constexpr (std::is_same_v<T, std::string>) {
    *out = text;
    return true;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (text == "true")
      *out = true;
    else if (text == "false")
      *out = false;
    else
      return false;
    return true;
  } else {
    std::istringstream in(text);
    T v{};
    in >> v;
    if (in.fail() || !in.eof()) return false;
    *out = v;
    return true;
  }
}

Status SetField(JobSpec* spec, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgumentError("--set: '" + assignment +
                                "' is not KEY=VALUE (hint: e.g. --set train.steps=10)");
  }
  const std::string key = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  bool found = false, ok = true;
  ForEachJobSpecField(*spec, [&](std::string_view section, std::string_view name, auto& member) {
    const std::string full =
        section.empty() ? std::string(name) : std::string(section) + "." + std::string(name);
    if (full != key) return;
    found = true;
    ok = ParseValue(value, &member);
  });
  if (!found) {
    return InvalidArgumentError("--set: " + key +
                                " is not a field of the job spec (hint: see docs/job-spec.md)");
  }
  if (!ok) {
    return InvalidArgumentError("--set: " + key + ": '" + value +
                                "' is not a value of its type (hint: see docs/job-spec.md)");
  }
  return OkStatus();
}

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

class JsonLines final : public TrainObserver {
 public:
  void OnStep(const StepMetrics& m) override {
    std::string comm;
    for (const auto& [key, c] : m.comm) {
      if (!comm.empty()) comm += ",";
      comm += std::string("{\"axis\":\"") + CommChargeLabel(key.first) + "\",\"op\":\"" +
              CommOpName(key.second) + "\",\"seconds\":" + Num(c.seconds) +
              ",\"exposed_seconds\":" + Num(c.exposed_seconds) +
              ",\"overlapped_seconds\":" + Num(c.overlapped_seconds()) +
              ",\"bytes\":" + Num(c.bytes) + ",\"calls\":" + std::to_string(c.calls) + "}";
    }
    std::cout << "{\"event\":\"step\",\"step\":" << m.step << ",\"loss\":" << Num(m.loss)
              << ",\"lr\":" << Num(m.lr) << ",\"grad_norm\":" << Num(m.grad_norm)
              << ",\"step_seconds\":" << Num(m.step_seconds)
              << ",\"tokens_per_second\":" << Num(m.tokens_per_second)
              << ",\"tflops\":" << Num(m.tflops) << ",\"mfu\":" << Num(m.mfu)
              << ",\"peak_memory_bytes\":" << m.peak_memory_bytes << ",\"comm\":[" << comm << "]}"
              << std::endl;
  }
  void OnEval(const EvalMetrics& e) override {
    std::cout << "{\"event\":\"eval\",\"step\":" << e.step << ",\"loss\":" << Num(e.loss)
              << ",\"tokens\":" << e.tokens << "}" << std::endl;
  }
  void OnLog(const std::string& line) override { std::cerr << line << std::endl; }
};

int Main(int argc, char** argv) {
  JobSpec spec;
  int rank = 0, world = 1;
  std::string store_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&](const char* flag) -> StatusOr<std::string> {
      if (i + 1 >= argc) {
        return InvalidArgumentError(std::string(flag) +
                                    ": needs a value (hint: meshrun-train --help)");
      }
      return std::string(argv[++i]);
    };
    if (arg == "--help" || arg == "-h") {
      std::cout
          << "usage: meshrun-train [--set KEY=VALUE]... [--rank R --world W --store-dir DIR]\n"
             "  Trains the job spec of docs/job-spec.md (its defaults, changed by --set) "
             "through the engine's Trainer\n  and prints the `meshrun train -o json` step "
             "lines and summary. MESHRUN_PEAK_TFLOPS overrides MFU's peak.\n";
      return 0;
    }
    StatusOr<std::string> v = InvalidArgumentError("");
    if (arg == "--set" || arg == "--rank" || arg == "--world" || arg == "--store-dir") {
      v = next(arg.c_str());
      if (!v.ok()) return Fail(v.status());
    }
    if (arg == "--set") {
      if (Status s = SetField(&spec, *v); !s.ok()) return Fail(s);
    } else if (arg == "--rank" || arg == "--world") {
      int n = 0;
      if (!ParseValue(*v, &n) || n < 0) {
        return Fail(InvalidArgumentError(arg + ": '" + *v + "' is not a rank count or index"));
      }
      (arg == "--rank" ? rank : world) = n;
    } else if (arg == "--store-dir") {
      store_dir = *v;
    } else {
      return Fail(InvalidArgumentError(arg + ": unknown argument (hint: meshrun-train --help)"));
    }
  }
  if (Status s = ValidateJobSpec(spec, world); !s.ok()) return Fail(s);
  if (Status s = CheckTrainingDevice(spec.resources.device); !s.ok()) return Fail(s);
  StatusOr<ParallelDims> dims = MeshOf(spec);
  if (!dims.ok()) return Fail(dims.status());
  if (rank >= world) {
    return Fail(InvalidArgumentError("--rank: " + std::to_string(rank) + " is outside --world " +
                                     std::to_string(world)));
  }
  RankContext ctx;
  ctx.rank = rank;
  const int cuda_device = spec.resources.device == "cuda" ? RankCudaDevice(rank) : 0;
  ctx.cuda_device = cuda_device;  // the model's GPU is the communicators' GPU
  if (world > 1) {
    if (store_dir.empty()) {
      return Fail(InvalidArgumentError(
          "--store-dir: a rank of " + std::to_string(world) +
          " needs a folder its peers share (hint: --store-dir DIR, the same on every rank)"));
    }
    StatusOr<std::shared_ptr<FileStore>> store = FileStore::Create(store_dir);
    if (!store.ok()) return Fail(store.status());
    ctx.store = *store;
    MeshCommsOptions options;
    options.timeout = std::chrono::seconds(spec.parallelism.comm_timeout_seconds);
    CommBackendOptions backend;
    backend.cuda_device = cuda_device;
    StatusOr<std::unique_ptr<MeshComms>> comms =
        ConnectMesh(spec.resources.device, *dims, rank, ctx.store, std::make_shared<CommStats>(),
                    options, backend);
    if (!comms.ok()) return Fail(comms.status());
    ctx.comms = std::move(comms).value();
  }
  TrainOptions train;
  std::string note;
  StatusOr<double> peak = RankPeakFlops(spec.resources.device, cuda_device, &note);
  if (!peak.ok()) return Fail(peak.status());
  if (!note.empty()) std::cerr << note << std::endl;
  train.peak_flops = *peak;
  StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, train, ctx);
  if (!trainer.ok()) return Fail(trainer.status());
  JsonLines out;
  StatusOr<RunSummary> summary = (*trainer)->Run(&out);
  if (!summary.ok()) return Fail(summary.status());
  std::string losses;
  for (double l : summary->losses) losses += (losses.empty() ? "" : ",") + Num(l);
  std::cout << "{\"event\":\"summary\",\"steps\":" << summary->steps
            << ",\"final_loss\":" << Num(summary->final_loss) << ",\"losses\":[" << losses
            << "],\"tokens_per_second\":" << Num(summary->tokens_per_second)
            << ",\"mfu\":" << Num(summary->mfu)
            << ",\"peak_memory_bytes\":" << summary->peak_memory_bytes << ",\"device\":\""
            << spec.resources.device << "\",\"precision\":\"" << spec.train.precision << "\"}"
            << std::endl;
  return 0;
}

}  // namespace
}  // namespace meshrun

int main(int argc, char** argv) {
  return meshrun::Main(argc, argv);
}
