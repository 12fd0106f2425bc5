// bench/pipeline: the pipeline's measured bubble beside its theory (issue 33, decision 0060).
// Each row trains a Llama-shaped model (untied, so no tied-embedding exchange) under pp P with
// one schedule, in one process: the P ranks are threads over the fake backend, one compute
// thread each, every chunk holding the same number of layers (parallelism.pp_layers). Of the
// steps after the warm-up it takes the least disturbed one (the machine is shared: the step
// whose slowest stage was quickest) and shows per stage its step time and its measured bubble
// (`measured`: StepMetrics::pipeline_bubble_ratio, what the rank exports: the step's time in the
// pp axis's communication ÷ the step time), and of it the part inside the pipeline's timetable
// (`loop`: without the wait in the grad norm's sum over pp after the last operation, where a
// stage that finished waits for the stages before it to drain), beside four theories:
//   equal     PipelineBubbleTheory with equal operation times: (P − 1)/(M + P − 1), (P − 1)/(v·M
//             + P − 1) interleaved, (P − 1)/(3M + P − 1) zero-bubble (equal stages, F = B = W, no
//             communication);
//   theory    the exported theory (StepMetrics::pipeline_bubble_theory), the stages' mean: the
//             same for 1F1B and interleaved (their bubble does not depend on how F and B
//             compare); zero-bubble's ZB-H1 formula at each stage's measured F + B and W
//             (decision 0068);
//   async     the same operation lists run as soon as their inputs are there, one core per
//             stage, each operation taking its stage's measured time for its kind
//             (StepMetrics::pipeline_op_seconds of the same step: forward, backward, weight, the
//             last chunk's backward that runs its forward too): the schedule's bubble at the
//             engine's own operation times, what an executor without lockstep (the engine's on
//             host backends since decision 0064, the default --executor async) can reach;
//   lockstep  the timetable (BuildTimetable) replayed with those times, one core per stage:
//             each exchange completes when both ends have posted it: the engine's executor on
//             device backends (NCCL), and on host backends before decision 0064 or with
//             --executor lockstep (TrainOptions::pipeline_lockstep);
//   cores     the same replay with the stages sharing --cores cores (a stage computes at
//             min(1, cores / stages computing)): what this host can show.
// With more stages than cores the operation times are the last run's with a core per stage,
// per layer, scaled to this run's layers per chunk ("scaled").
// m/th is measured ÷ theory, m/core measured ÷ cores, m/as measured ÷ async. Prints a table and
// one JSON line.
//
//   pipeline [--schedules 1f1b,interleaved_1f1b] [--pp 2,4] [--micro-batches 8]
//            [--virtual-stages 2] [--layers 8] [--d-model 256] [--seq-len 128] [--steps 8]
//            [--warmup 2] [--cores N] [--executor async|lockstep] [--checkpointing none|full]
#include "engine/train/pipeline.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/fake_backend.h"
#include "engine/comm/store.h"
#include "engine/train/trainer.h"

namespace {

namespace fs = std::filesystem;
using meshrun::PipeOp;
using meshrun::PipeOpKind;
using meshrun::PpSchedule;

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Options {
  std::vector<std::string> schedules = {"1f1b", "interleaved_1f1b"};
  std::vector<int> pp = {2, 4};
  int micro_batches = 8, virtual_stages = 2, layers = 8, d_model = 256, seq_len = 128;
  int steps = 8, warmup = 2, cores = 0;
  bool lockstep = false;  // --executor lockstep: TrainOptions::pipeline_lockstep
  // --checkpointing: train.activation_checkpointing. none: the chunks keep their forwards'
  // activations (decision 0066); full: they keep their inputs and each backward runs its
  // forward again (decision 0054).
  std::string checkpointing = "none";
};

// One rank's steps after the warm-up.
struct RankRecord {
  std::vector<double> step_seconds, bubble, theory, drain_seconds;
  // Per step, the seconds of one operation of each kind (StepMetrics::pipeline_op_seconds ÷
  // pipeline_ops; 0 where none ran): forward, backward, weight, the last chunk's backward.
  std::vector<std::array<double, 4>> op_seconds;
};

// Records each step's times, and the step's time in the pp axis's collectives (the grad norm's
// sum over pp; the difference of that cumulative counter).
class BenchObserver : public meshrun::TrainObserver {
 public:
  BenchObserver(RankRecord* out, int warmup) : out_(out), warmup_(warmup) {}
  void OnStep(const meshrun::StepMetrics& m) override {
    double reduce = 0;
    for (const auto& [key, c] : m.comm) {
      // The pp axis's collectives (the grad norm's sum is an all-gather over pp); its sends and
      // receives are the pipeline's, already in the measured bubble.
      if (key.first == meshrun::CommCharge::Axis(meshrun::MeshAxis::kPp) &&
          key.second != meshrun::CommOp::kSend && key.second != meshrun::CommOp::kRecv &&
          key.second != meshrun::CommOp::kSendRecv) {
        reduce += c.seconds;
      }
    }
    const double drain = reduce - last_reduce_;
    last_reduce_ = reduce;
    if (m.step <= warmup_) return;
    out_->step_seconds.push_back(m.step_seconds);
    out_->bubble.push_back(m.pipeline_bubble_ratio);
    out_->theory.push_back(m.pipeline_bubble_theory);
    out_->drain_seconds.push_back(drain);
    std::array<double, 4> op{};
    for (int k = 0; k < 4; ++k) {
      op[k] = m.pipeline_ops[k] > 0 ? m.pipeline_op_seconds[k] / m.pipeline_ops[k] : 0;
    }
    out_->op_seconds.push_back(op);
  }

 private:
  RankRecord* out_;
  int warmup_;
  double last_reduce_ = 0;
};

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

meshrun::JobSpec SpecOf(const Options& o, const fs::path& data, int P, const std::string& sched,
                        int v) {
  meshrun::JobSpec spec;
  spec.name = "bench-pipeline";
  spec.model.arch = "llama";
  spec.model.n_layer = o.layers;
  spec.model.d_model = o.d_model;
  spec.model.n_head = std::max(1, o.d_model / 64);
  spec.model.n_kv_head = spec.model.n_head;
  spec.model.d_ff = 4 * o.d_model;
  spec.model.seq_len = o.seq_len;
  spec.model.vocab_size = 256;
  spec.model.tie_embeddings = false;
  spec.parallelism.pp_size = P;
  spec.parallelism.pp_schedule = sched;
  spec.parallelism.pp_virtual_stages = v;
  // Every chunk the same layers: the stages cost the same (the theory's assumption).
  spec.parallelism.pp_layers.assign(static_cast<size_t>(P * v), o.layers / (P * v));
  spec.parallelism.comm_timeout_seconds = 600;
  spec.train.steps = o.warmup + o.steps;
  spec.train.micro_batch_size = 1;
  spec.train.global_batch_size = o.micro_batches;
  spec.train.activation_checkpointing = o.checkpointing;
  spec.train.lr = 1e-3;
  spec.train.min_lr = 1e-4;
  spec.train.warmup_steps = 1;
  spec.train.grad_clip = 1.0;
  spec.data.train = data.string();
  spec.data.format = "text";
  spec.resources.threads = 1;
  return spec;
}

// Every rank of `spec` as a thread over the fake backend.
std::vector<meshrun::StatusOr<RankRecord>> RunRanks(const meshrun::JobSpec& spec, int warmup,
                                                    bool lockstep) {
  const meshrun::ParallelDims dims = meshrun::MeshOf(spec).value();
  const int world = dims.world_size();
  auto backend = std::make_shared<meshrun::FakeBackend>();
  std::shared_ptr<meshrun::Store> store = std::make_shared<meshrun::InMemoryStore>();
  std::vector<meshrun::StatusOr<RankRecord>> results(
      world, meshrun::InternalError("the rank did not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      results[rank] = [&]() -> meshrun::StatusOr<RankRecord> {
        meshrun::RankContext ctx;
        ctx.rank = rank;
        meshrun::MeshCommsOptions comm_options;
        comm_options.timeout = std::chrono::seconds(600);
        MESHRUN_ASSIGN_OR_RETURN(
            std::unique_ptr<meshrun::MeshComms> comms,
            meshrun::MeshComms::Create(dims, rank, store, *backend,
                                       std::make_shared<meshrun::CommStats>(), comm_options));
        ctx.comms = std::move(comms);
        ctx.store = store;
        meshrun::TrainOptions options;
        options.peak_flops = 1e12;
        options.pipeline_lockstep = lockstep;
        MESHRUN_ASSIGN_OR_RETURN(std::unique_ptr<meshrun::Trainer> trainer,
                                 meshrun::Trainer::Create(spec, options, ctx));
        RankRecord record;
        BenchObserver observer(&record, warmup);
        MESHRUN_RETURN_IF_ERROR(trainer->Run(&observer).status());
        return record;
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// The operation kinds a schedule's list uses: 0 forward, 1 backward, 2 anything else (a
// zero-bubble weight pass).
// Each stage's time for one operation of each kind: forward, backward, weight gradients, and
// the pipeline's last chunk's backward (which runs its forward too).
using Costs = std::vector<std::array<double, 4>>;

// An operation's time on one core: its stage's time for its kind.
double OpCost(const PipeOp& op, int p, int P, int v, const Costs& cost);

int KindIndex(const PipeOp& op) {
  if (op.kind == PipeOpKind::kForward) return 0;
  if (op.kind == PipeOpKind::kBackward) return 1;
  return 2;
}

double OpCost(const PipeOp& op, int p, int P, int v, const Costs& cost) {
  const bool last = p == P - 1 && op.chunk == v - 1;
  const int k = op.kind == PipeOpKind::kBackward && last ? 3 : KindIndex(op);
  return cost[static_cast<size_t>(p)][static_cast<size_t>(k)];
}

// The engine's timetable replayed (decision 0054): each slot, every rank runs its operation,
// then the forwards' outputs move one rank on and then the input gradients one rank back, each
// exchange completing when both ends have posted it (the fake backend's and Gloo's sends wait
// for the receive). `cost[k]` is the time of an operation of kind k on one core; the ranks share
// `cores` cores. Returns each stage's bubble: its time not computing ÷ the pipeline's time.
std::vector<double> ReplayTimetable(const std::vector<std::vector<PipeOp>>& ops,
                                    const meshrun::PipeTimetable& table, int P, int v,
                                    const Costs& cost, double cores) {
  const size_t slots = table.slots.size();
  auto op_at = [&](size_t t, int p) -> const PipeOp* {
    const int i = table.slots[t][p];
    return i < 0 ? nullptr : &ops[p][static_cast<size_t>(i)];
  };
  // Phase of rank p: 3·t + 0 computing slot t's operation, + 1 its forward exchange, + 2 its
  // backward exchange; 3·slots: done.
  struct Rank {
    size_t phase = 0;
    double left = 0;      // work left of the computation
    bool posted = false;  // in an exchange, waiting for its partners
    double busy = 0;
  };
  std::vector<Rank> r(P);
  auto sends = [&](size_t t, int p, int exchange) {  // does p send in this exchange?
    const PipeOp* op = op_at(t, p);
    if (op == nullptr) return false;
    if (exchange == 1) return op->kind == PipeOpKind::kForward;
    return op->kind == PipeOpKind::kBackward && op->chunk * P + p > 0;
  };
  auto partners = [&](size_t t, int p, int exchange) {
    std::vector<int> out;
    const int next = (p + 1) % P, prev = (p + P - 1) % P;
    const int dst = exchange == 1 ? next : prev, src = exchange == 1 ? prev : next;
    if (sends(t, p, exchange)) out.push_back(dst);
    if (sends(t, src, exchange)) out.push_back(src);
    return out;
  };
  auto enter = [&](int p) {  // rank p starts its current phase
    Rank& k = r[p];
    while (k.phase < 3 * slots) {
      const size_t t = k.phase / 3;
      const int e = static_cast<int>(k.phase % 3);
      if (e == 0) {
        const PipeOp* op = op_at(t, p);
        if (op != nullptr) {
          k.left = OpCost(*op, p, P, v, cost);
          return;
        }
      } else if (!partners(t, p, e).empty()) {
        k.posted = true;
        return;
      }
      ++k.phase;
    }
  };
  for (int p = 0; p < P; ++p) enter(p);
  double now = 0;
  for (int guard = 0; guard < 1000000; ++guard) {
    // Exchanges whose every end has posted complete now.
    bool moved = true;
    while (moved) {
      moved = false;
      for (int p = 0; p < P; ++p) {
        Rank& k = r[p];
        if (!k.posted) continue;
        bool ready = true;
        for (int q : partners(k.phase / 3, p, static_cast<int>(k.phase % 3))) {
          ready = ready && (r[q].phase > k.phase || (r[q].phase == k.phase && r[q].posted));
        }
        if (!ready) continue;
        // Complete both ends together: partners at the same phase posting it move on too.
        k.posted = false;
        ++k.phase;
        enter(p);
        moved = true;
      }
    }
    int computing = 0;
    for (int p = 0; p < P; ++p) computing += r[p].phase < 3 * slots && !r[p].posted ? 1 : 0;
    if (computing == 0) break;
    const double rate = std::min(1.0, cores / computing);
    double dt = 1e300;
    for (int p = 0; p < P; ++p) {
      if (r[p].phase < 3 * slots && !r[p].posted) dt = std::min(dt, r[p].left / rate);
    }
    now += dt;
    for (int p = 0; p < P; ++p) {
      Rank& k = r[p];
      if (k.phase >= 3 * slots || k.posted) continue;
      k.left -= dt * rate;
      k.busy += dt;
      if (k.left <= 1e-12) {
        ++k.phase;
        enter(p);
      }
    }
  }
  std::vector<double> bubble(P);
  for (int p = 0; p < P; ++p) bubble[p] = now > 0 ? 1.0 - r[p].busy / now : 0;
  return bubble;
}

// The same operations run as soon as their inputs are there (no lockstep: a send does not wait
// for its receive, one core per stage): what an asynchronous executor would take. A forward of
// pipeline chunk g needs the forward of g − 1; a backward of g the backward of g + 1 (the last
// chunk's backward the forward of the chunk before it). Returns each stage's bubble.
std::vector<double> ReplayAsynchronous(const std::vector<std::vector<PipeOp>>& ops, int P, int v,
                                       int M, const Costs& cost) {
  const int G = P * v;
  // The end time of each (kind, g, m): forward and backward.
  std::vector<double> fwd_end(static_cast<size_t>(G) * M, -1), bwd_end(fwd_end.size(), -1);
  auto at = [&](int g, int m) { return static_cast<size_t>(g) * M + m; };
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0), busy(P, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int p = 0; p < P; ++p) {
      while (next[p] < ops[p].size()) {
        const PipeOp& op = ops[p][next[p]];
        const int g = op.chunk * P + p;
        double ready = 0;
        if (op.kind == PipeOpKind::kForward) {
          if (g > 0) ready = fwd_end[at(g - 1, op.micro)];
        } else if (op.kind == PipeOpKind::kBackward) {
          if (g < G - 1) {
            ready = bwd_end[at(g + 1, op.micro)];
          } else if (g > 0) {
            ready = fwd_end[at(g - 1, op.micro)];
          }
        }
        if (ready < 0) break;  // its input is not there yet
        const double start = std::max(free_at[p], ready);
        const double end = start + OpCost(op, p, P, v, cost);
        free_at[p] = end;
        busy[p] += end - start;
        if (op.kind == PipeOpKind::kForward) fwd_end[at(g, op.micro)] = end;
        if (op.kind == PipeOpKind::kBackward) bwd_end[at(g, op.micro)] = end;
        ++next[p];
        progress = true;
      }
    }
  }
  const double span = *std::max_element(free_at.begin(), free_at.end());
  std::vector<double> bubble(P);
  for (int p = 0; p < P; ++p) bubble[p] = span > 0 ? 1.0 - busy[p] / span : 0;
  return bubble;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.cores = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s: missing value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&]() { return std::atoi(next().c_str()); };
    if (a == "--schedules") {
      o.schedules = SplitList(next());
    } else if (a == "--pp") {
      o.pp.clear();
      for (const std::string& s : SplitList(next())) o.pp.push_back(std::atoi(s.c_str()));
    } else if (a == "--micro-batches") {
      o.micro_batches = number();
    } else if (a == "--virtual-stages") {
      o.virtual_stages = number();
    } else if (a == "--layers") {
      o.layers = number();
    } else if (a == "--d-model") {
      o.d_model = number();
    } else if (a == "--seq-len") {
      o.seq_len = number();
    } else if (a == "--steps") {
      o.steps = number();
    } else if (a == "--warmup") {
      o.warmup = number();
    } else if (a == "--cores") {
      o.cores = number();
    } else if (a == "--executor") {
      const std::string e = next();
      if (e != "async" && e != "lockstep") {
        std::fprintf(stderr, "error: --executor: unknown executor '%s' (hint: async or lockstep)\n",
                     e.c_str());
        return 2;
      }
      o.lockstep = e == "lockstep";
    } else if (a == "--checkpointing") {
      o.checkpointing = next();
      if (o.checkpointing != "none" && o.checkpointing != "full") {
        std::fprintf(stderr,
                     "error: --checkpointing: '%s' (hint: none, the chunks keep their forwards' "
                     "activations, or full, each backward runs its forward again)\n",
                     o.checkpointing.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "error: %s: unknown flag (hint: see the comment at the top of "
                   "bench/pipeline/pipeline.cc)\n",
                   a.c_str());
      return 2;
    }
  }
  for (const std::string& s : o.schedules) {
    if (!meshrun::ParsePpSchedule(s)) {
      std::fprintf(stderr,
                   "error: --schedules: unknown schedule '%s' (hint: 1f1b, interleaved_1f1b or "
                   "zero_bubble)\n",
                   s.c_str());
      return 2;
    }
  }
  // The training text: bytes of a pseudo-random word list (vocab 256, byte tokens).
  char pattern[] = "/tmp/meshrun_bench_pipeline_XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path dir(pattern);
  {
    std::ofstream out(dir / "train.txt");
    uint32_t x = 2468;
    for (int line = 0; line < 4000; ++line) {
      for (int w = 0; w < 12; ++w) {
        x = x * 1664525u + 1013904223u;
        out << "w" << (x >> 20) % 97 << ' ';
      }
      out << '\n';
    }
  }
  std::printf(
      "# llama %d layers, d_model %d, seq_len %d, micro_batch 1, %d micro-batches; one "
      "thread per stage, the stages threads over the fake backend on %u cores; the quickest of %d "
      "steps after %d warm-up; the %s executor; activation checkpointing %s (%s)\n",
      o.layers, o.d_model, o.seq_len, o.micro_batches, std::thread::hardware_concurrency(), o.steps,
      o.warmup, o.lockstep ? "lockstep" : "asynchronous", o.checkpointing.c_str(),
      o.checkpointing == "none" ? "forwards kept" : "each backward runs its forward again");
  std::ostringstream json;
  json << "{\"bench\":\"pipeline\",\"micro_batches\":" << o.micro_batches
       << ",\"layers\":" << o.layers << ",\"d_model\":" << o.d_model << ",\"seq_len\":" << o.seq_len
       << ",\"steps\":" << o.steps << ",\"cores\":" << o.cores << ",\"executor\":\""
       << (o.lockstep ? "lockstep" : "async") << "\",\"checkpointing\":\"" << o.checkpointing
       << "\",\"results\":[";
  std::ostringstream table;
  bool first_row = true;
  double per_layer[4] = {0, 0, 0, 0};  // each kind's seconds per layer (stages ≤ cores)
  for (int P : o.pp) {
    for (const std::string& name : o.schedules) {
      const PpSchedule schedule = *meshrun::ParsePpSchedule(name);
      const int v = schedule == PpSchedule::kInterleaved1F1B ? o.virtual_stages : 1;
      const std::string label = "pp " + std::to_string(P) + " " + name +
                                (v > 1 ? " v" + std::to_string(v) : std::string());
      if (o.layers % (P * v) != 0) {
        std::printf("# %s: skipped (%d layers do not split evenly into %d chunks)\n", label.c_str(),
                    o.layers, P * v);
        continue;
      }
      const meshrun::JobSpec spec = SpecOf(o, dir / "train.txt", P, name, v);
      if (meshrun::Status s = meshrun::ValidateJobSpec(spec); !s.ok()) {
        std::printf("# %s: not run: %s\n", label.c_str(), s.ToString().c_str());
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const auto ranks = RunRanks(spec, o.warmup, o.lockstep);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bool ok = true;
      for (const auto& r : ranks) {
        if (!r.ok()) {
          std::printf("# %s: failed: %s\n", label.c_str(), r.status().ToString().c_str());
          ok = false;
          break;
        }
      }
      if (!ok) continue;
      // The least disturbed step (the machine is shared): the one whose slowest stage took
      // the least time. Per stage: its step time, the engine's bubble, the bubble with the drain.
      const size_t steps = ranks[0]->step_seconds.size();
      size_t best = 0;
      double best_seconds = 1e300;
      for (size_t k = 0; k < steps; ++k) {
        double slowest = 0;
        for (int p = 0; p < P; ++p) slowest = std::max(slowest, ranks[p]->step_seconds[k]);
        if (slowest < best_seconds) best_seconds = slowest, best = k;
      }
      std::vector<double> step(P), engine(P), drained(P), drained_mean(P), busy(P);
      // The exported theory, the mean of the stages' (zero-bubble's is at each stage's own
      // operation times, decision 0068), and the equal-times figure beside it.
      double theory = 0;
      const double textbook = meshrun::PipelineBubbleTheory(schedule, P, o.micro_batches, v);
      for (int p = 0; p < P; ++p) {
        const RankRecord& rec = *ranks[p];
        std::vector<double> d(rec.step_seconds.size());
        for (size_t k = 0; k < d.size(); ++k) {
          d[k] = rec.bubble[k];
        }
        step[p] = rec.step_seconds[best];
        engine[p] = std::max(0.0, rec.bubble[best] - rec.drain_seconds[best] / step[p]);
        drained[p] = d[best];
        drained_mean[p] = Mean(d);
        busy[p] = step[p] * (1 - drained[p]);
        theory += Mean(rec.theory) / P;
      }
      // The op times: each stage's own, measured in the chosen step (StepMetrics::
      // pipeline_op_seconds ÷ pipeline_ops). With more stages than cores a stage's operations are
      // stretched by its sharing the cores: the times per layer of the last run with stages ≤
      // cores are used instead, scaled to this run's layers per chunk.
      std::vector<std::vector<PipeOp>> ops(P);
      for (int p = 0; p < P; ++p) {
        ops[p] = meshrun::PipelineOps(schedule, P, p, o.micro_batches, v);
      }
      Costs cost(static_cast<size_t>(P));
      for (int p = 0; p < P; ++p) cost[static_cast<size_t>(p)] = ranks[p]->op_seconds[best];
      const double layers_per_chunk = static_cast<double>(o.layers) / (P * v);
      std::string source = "measured";
      std::array<double, 4> mean_op{};  // per kind, over the stages that run it
      for (int k = 0; k < 4; ++k) {
        double sum = 0;
        int n = 0;
        for (int p = 0; p < P; ++p) {
          const double c = cost[static_cast<size_t>(p)][static_cast<size_t>(k)];
          if (c > 0) sum += c, ++n;
        }
        mean_op[static_cast<size_t>(k)] = n > 0 ? sum / n : 0;
      }
      if (P <= o.cores) {
        for (int k = 0; k < 4; ++k)
          per_layer[k] = mean_op[static_cast<size_t>(k)] / layers_per_chunk;
      } else if (per_layer[1] > 0) {
        for (auto& c : cost) {
          for (int k = 0; k < 4; ++k) c[static_cast<size_t>(k)] = per_layer[k] * layers_per_chunk;
        }
        for (int k = 0; k < 4; ++k)
          mean_op[static_cast<size_t>(k)] = per_layer[k] * layers_per_chunk;
        source = "scaled";
      }
      bool timed = true;  // every operation has a time
      for (int p = 0; p < P; ++p) {
        for (const PipeOp& op : ops[p]) timed = timed && OpCost(op, p, P, v, cost) > 0;
      }
      std::vector<double> lockstep(P, 0), shared(P, 0), async(P, 0);
      const meshrun::StatusOr<meshrun::PipeTimetable> timetable =
          meshrun::BuildTimetable(ops, P, v, o.micro_batches);
      if (timetable.ok() && timed) {
        lockstep = ReplayTimetable(ops, *timetable, P, v, cost, P);
        shared = ReplayTimetable(ops, *timetable, P, v, cost, std::min<double>(P, o.cores));
        async = ReplayAsynchronous(ops, P, v, o.micro_batches, cost);
      }
      const double mean_engine = Mean(engine), mean_drained = Mean(drained);
      const double mean_lockstep = Mean(lockstep), mean_shared = Mean(shared);
      const double mean_async = Mean(async);
      auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
      char row[512];
      std::snprintf(row, sizeof(row),
                    "%-24s %7.3f %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %6.2f "
                    "%6.2f %6.2f  F %.1f, B %.1f, W %.1f, last B %.1f ms (%s)\n",
                    label.c_str(), Mean(step), 100 * textbook, 100 * theory, 100 * mean_async,
                    100 * mean_lockstep, 100 * mean_shared, 100 * mean_engine, 100 * mean_drained,
                    ratio(mean_drained, theory), ratio(mean_drained, mean_shared),
                    ratio(mean_drained, mean_async), 1e3 * mean_op[0], 1e3 * mean_op[1],
                    1e3 * mean_op[2], 1e3 * mean_op[3], source.c_str());
      table << row;
      for (int p = 0; p < P; ++p) {
        std::snprintf(
            row, sizeof(row),
            "  stage %-16d %7.3f %8s %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %6.2f %6.2f "
            "%6.2f\n",
            p, step[p], "", 100 * Mean(ranks[p]->theory), 100 * async[p], 100 * lockstep[p],
            100 * shared[p], 100 * engine[p], 100 * drained[p], ratio(drained[p], theory),
            ratio(drained[p], shared[p]), ratio(drained[p], async[p]));
        table << row;
      }
      std::printf("# %s: %.1f s\n", label.c_str(), wall);
      std::fflush(stdout);
      auto list = [](const std::vector<double>& v) {
        std::ostringstream s;
        s << "[";
        for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
        s << "]";
        return s.str();
      };
      json << (first_row ? "" : ",") << "{\"pp\":" << P << ",\"schedule\":\"" << name
           << "\",\"virtual_stages\":" << v << ",\"step_seconds\":" << list(step)
           << ",\"theory_equal_times\":" << textbook << ",\"theory\":" << theory
           << ",\"theory_asynchronous\":" << list(async)
           << ",\"theory_timetable\":" << list(lockstep)
           << ",\"theory_timetable_cores\":" << list(shared)
           << ",\"measured_loop\":" << list(engine) << ",\"measured\":" << list(drained)
           << ",\"measured_mean\":" << mean_drained
           << ",\"measured_all_steps\":" << list(drained_mean)
           << ",\"ratio\":" << (theory > 0 ? mean_drained / theory : 0)
           << ",\"ratio_async\":" << ratio(mean_drained, mean_async)
           << ",\"op_seconds\":{\"forward\":" << mean_op[0] << ",\"backward\":" << mean_op[1]
           << ",\"weight\":" << mean_op[2] << ",\"last_backward\":" << mean_op[3]
           << "},\"op_times\":\"" << source << "\"}";
      first_row = false;
    }
  }
  json << "]}";
  std::printf("%-24s %7s %8s %8s %8s %8s %8s %8s %8s %6s %6s %6s\n", "schedule / stage", "step s",
              "equal", "theory", "async", "lockstep", "cores", "loop", "measured", "m/th", "m/core",
              "m/as");
  std::printf("%s%s\n", table.str().c_str(), json.str().c_str());
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
