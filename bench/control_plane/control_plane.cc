// Control-plane benchmark: a real meshrun-coordinator (the binary, as a child process) under
// simulated workers. W workers × S slots register and open WorkerSession streams (gRPC callback
// API, one connection each), an R-rank job is submitted and placed on all of them, and then
// every worker heartbeats at --hz with one RankMetrics per rank per beat while a client probes
// GetJob and ListWorkers and follows the job with WatchJob(rank_metrics).
//
//   control_plane [--workers 1024] [--slots 8] [--tp 8] [--seconds 15] [--hz 1]
//                 [--coordinator PATH]
//
// Reports: time to connect the workers; SubmitJob latency (placement and persistence happen
// inside it) and the time until every assignment reached its worker and every rank was
// reported RUNNING; p50/p99 of GetJob (with all ranks) and ListWorkers under load, and of the
// forwarding delay of a rank's metrics sample from its worker to a WatchJob client; the
// coordinator's CPU (from /proc during the steady state, and getrusage of the child in all)
// and its RSS. A table, then one JSON line. Wall-clock figures from a shared machine: noisy.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/proto_time.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "proto/spec_convert.h"
#include "tests/coordinator/grpc_test_util.h"
#include "tests/fakes/fake_grpc_worker.h"

namespace meshrun {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
  size_t n = 0;
};

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  p.n = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  p.p50 = at(0.50);
  p.p99 = at(0.99);
  p.max = v.back();
  return p;
}

// utime + stime of a process, in seconds, and its resident and peak resident set in MiB.
struct ProcStats {
  double cpu_s = 0, rss_mib = 0, hwm_mib = 0;
};

ProcStats ReadProc(pid_t pid) {
  ProcStats s;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = content.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(content.substr(close + 2));
    std::string field;
    std::vector<std::string> fields;
    while (rest >> field) fields.push_back(field);
    // Fields after the command: state is index 0, utime index 11, stime index 12.
    if (fields.size() > 12) {
      const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
      s.cpu_s = (std::stod(fields[11]) + std::stod(fields[12])) / hz;
    }
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_mib = std::stod(line.substr(6)) / 1024.0;
    if (line.rfind("VmHWM:", 0) == 0) s.hwm_mib = std::stod(line.substr(6)) / 1024.0;
  }
  return s;
}

struct SimWorker {
  std::unique_ptr<testing::FakeGrpcWorker> worker;
  std::mutex mu;
  std::vector<v1::RankAssignment> ranks;  // guarded by mu
};

struct Config {
  int workers = 1024;
  int slots = 8;
  int tp = 8;
  double seconds = 15;
  double hz = 1;
  std::string coordinator;
};

v1::SubmitJobRequest JobOfSize(int world, int tp) {
  // dp_replicate × dp_shard × tp with dp_shard up to 16: HSDP across workers.
  const int groups = world / tp;
  const int shard = std::min(16, groups);
  JobSpec spec;
  spec.name = "bench-job";
  spec.model.n_head = tp;
  spec.model.d_model = 8 * tp;
  spec.parallelism = {groups / shard, shard, 1, tp, "allgather"};
  spec.train.steps = 1000;
  spec.train.global_batch_size = groups;
  spec.train.micro_batch_size = 1;
  spec.data.train = "/data/bench.txt";
  v1::SubmitJobRequest req;
  *req.mutable_spec() = meshrun::JobSpecToProto(spec);
  req.set_request_id("bench-1");
  return req;
}

int Run(const Config& cfg) {
  const int world = cfg.workers * cfg.slots;
  if (world % cfg.tp != 0 || cfg.slots % cfg.tp != 0) {
    std::fprintf(stderr, "error: --tp: %d must divide --slots (%d)\n", cfg.tp, cfg.slots);
    return 2;
  }
  const std::string state =
      (std::filesystem::temp_directory_path() / ("meshrun-bench-cp-" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(state);
  testing::Subprocess coord(
      {cfg.coordinator, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--state-dir",
       state, "--heartbeat-timeout", "10", "--log-level", "warn"},
      state + ".stderr");
  auto first = coord.ReadLine(seconds(30));
  if (!first) {
    std::fprintf(stderr, "error: --coordinator: %s did not start (see %s.stderr)\n",
                 cfg.coordinator.c_str(), state.c_str());
    return 1;
  }
  std::istringstream words(*first);
  std::string w, address;
  words >> w >> w >> w >> address;
  std::printf("coordinator %s (pid %d), %d workers x %d slots, %d-rank job\n", address.c_str(),
              coord.pid(), cfg.workers, cfg.slots, world);

  // ---- Connect the workers -----------------------------------------------------------------
  std::atomic<int> assigned{0};
  std::atomic<int64_t> last_assign_ns{0};
  std::vector<std::unique_ptr<SimWorker>> sims(cfg.workers);
  const auto t_connect = Clock::now();
  for (int i = 0; i < cfg.workers; ++i) {
    auto sim = std::make_unique<SimWorker>();
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // one connection per worker
    auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    char name[32];
    std::snprintf(name, sizeof(name), "sim-%05d", i);
    sim->worker = std::make_unique<testing::FakeGrpcWorker>(channel, name, cfg.slots);
    SimWorker* raw = sim.get();
    sim->worker->set_keep_messages(false);
    sim->worker->set_on_message(
        [raw, &assigned, &last_assign_ns](const v1::WorkerSessionResponse& m) {
          if (!m.has_assign()) return;
          {
            std::lock_guard<std::mutex> lock(raw->mu);
            raw->ranks.push_back(m.assign());
          }
          raw->worker->Started(m.assign(), 10'000 + m.assign().rank());
          last_assign_ns = Clock::now().time_since_epoch().count();
          ++assigned;
        });
    grpc::Status s = sim->worker->Register();
    if (!s.ok()) {
      std::fprintf(stderr, "error: register %s: %s\n", name, s.error_message().c_str());
      return 1;
    }
    sim->worker->Open();
    sims[i] = std::move(sim);
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::CoordinatorService::NewStub(channel);
  auto list_workers = [&](v1::ListWorkersResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
    return stub->ListWorkers(&ctx, v1::ListWorkersRequest(), out);
  };
  while (true) {
    v1::ListWorkersResponse resp;
    if (list_workers(&resp).ok() && resp.workers_size() == cfg.workers) break;
    if (Since(t_connect) > 60) {
      std::fprintf(stderr, "error: workers did not all register within 60 s\n");
      return 1;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  const double connect_s = Since(t_connect);

  // ---- Heartbeats and metrics, spread evenly over each period ------------------------------
  std::atomic<bool> stop{false};
  std::atomic<bool> measuring{false};
  std::atomic<int64_t> sent{0};
  std::thread driver([&] {
    const auto period = std::chrono::duration<double>(1.0 / cfg.hz);
    auto next = Clock::now();
    for (int64_t tick = 1; !stop; ++tick) {
      for (int i = 0; i < cfg.workers && !stop; ++i) {
        std::this_thread::sleep_until(next + std::chrono::duration_cast<Clock::duration>(
                                                 period * (static_cast<double>(i) / cfg.workers)));
        SimWorker& sim = *sims[i];
        std::vector<v1::RankAssignment> ranks;
        {
          std::lock_guard<std::mutex> lock(sim.mu);
          ranks = sim.ranks;
        }
        std::vector<v1::RunningRank> running;
        for (const auto& a : ranks) running.push_back(testing::FakeGrpcWorker::Running(a));
        sim.worker->Heartbeat(running);
        ++sent;
        for (const auto& a : ranks) {
          v1::WorkerSessionRequest m;
          v1::MetricsSample* s = m.mutable_metrics()->mutable_sample();
          s->set_job_id(a.job_id());
          s->set_attempt(a.attempt());
          s->set_rank(a.rank());
          s->set_step(tick);
          coordinator::SetTimestamp(std::chrono::system_clock::now(), s->mutable_time());
          s->set_loss(3.0);
          s->set_step_seconds(1.0 / cfg.hz);
          s->set_tokens_per_second(1000);
          s->set_mfu(0.4);
          sim.worker->Send(m);
          ++sent;
        }
      }
      next += std::chrono::duration_cast<Clock::duration>(period);
    }
  });

  // ---- Place and assign the job --------------------------------------------------------------
  const auto t_submit = Clock::now();
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(60));
    grpc::Status s = stub->SubmitJob(&ctx, JobOfSize(world, cfg.tp), &submitted);
    if (!s.ok()) {
      std::fprintf(stderr, "error: SubmitJob: %s\n", s.error_message().c_str());
      stop = true;
      driver.join();
      return 1;
    }
  }
  const double submit_rpc_s = Since(t_submit);
  auto get_job = [&](v1::GetJobResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
    v1::GetJobRequest req;
    req.set_job_id(submitted.job_id());
    return stub->GetJob(&ctx, req, out);
  };
  while (assigned < world && Since(t_submit) < 120) std::this_thread::sleep_for(milliseconds(5));
  const double assign_s = std::chrono::duration<double>(
                              Clock::time_point(Clock::duration(last_assign_ns.load())) - t_submit)
                              .count();
  double running_s = -1;
  while (Since(t_submit) < 120) {
    v1::GetJobResponse resp;
    if (get_job(&resp).ok()) {
      int n = 0;
      for (const auto& r : resp.job().ranks()) n += r.state() == v1::RANK_STATE_RUNNING;
      if (n == world) {
        running_s = Since(t_submit);
        break;
      }
    }
    std::this_thread::sleep_for(milliseconds(50));
  }

  // ---- Steady state: probes and a watcher ------------------------------------------------------
  std::vector<double> get_job_ms, list_workers_ms, forward_ms;
  std::mutex forward_mu;
  std::atomic<int64_t> job_samples{0};
  grpc::ClientContext watch_ctx;
  std::thread watcher([&] {
    v1::WatchJobRequest req;
    req.set_job_id(submitted.job_id());
    req.set_rank_metrics(true);
    req.set_skip_logs(true);
    v1::GetJobResponse now;
    if (get_job(&now).ok()) req.set_from_sequence(now.job().last_event_sequence() + 1);
    auto reader = stub->WatchJob(&watch_ctx, req);
    v1::WatchJobResponse resp;
    while (reader->Read(&resp)) {
      if (!resp.event().has_metrics()) continue;
      const v1::MetricsSample& s = resp.event().metrics();
      if (!s.has_rank()) {
        ++job_samples;
        continue;
      }
      if (!measuring) continue;
      const auto sent_at = std::chrono::system_clock::time_point(
          std::chrono::seconds(s.time().seconds()) + std::chrono::nanoseconds(s.time().nanos()));
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::system_clock::now() - sent_at)
              .count();
      std::lock_guard<std::mutex> lock(forward_mu);
      forward_ms.push_back(ms);
    }
    (void)reader->Finish();
  });

  std::this_thread::sleep_for(milliseconds(static_cast<int>(1500 / cfg.hz)));  // settle
  const ProcStats before = ReadProc(coord.pid());
  const int64_t sent_before = sent;
  const auto t_steady = Clock::now();
  measuring = true;
  while (Since(t_steady) < cfg.seconds) {
    auto t0 = Clock::now();
    v1::GetJobResponse job;
    if (get_job(&job).ok()) get_job_ms.push_back(Since(t0) * 1000);
    t0 = Clock::now();
    v1::ListWorkersResponse workers;
    if (list_workers(&workers).ok()) list_workers_ms.push_back(Since(t0) * 1000);
    std::this_thread::sleep_for(milliseconds(100));
  }
  measuring = false;
  const double steady_s = Since(t_steady);
  const ProcStats after = ReadProc(coord.pid());
  const double msgs_per_s = (sent - sent_before) / steady_s;

  // ---- Tear down and account the child ------------------------------------------------------
  stop = true;
  driver.join();
  watch_ctx.TryCancel();
  watcher.join();
  coord.Signal(SIGTERM);
  auto exit_status = coord.Wait(seconds(30));
  for (auto& sim : sims) sim->worker->Kill();
  rusage children{};
  getrusage(RUSAGE_CHILDREN, &children);
  const double child_cpu_s = children.ru_utime.tv_sec + children.ru_utime.tv_usec / 1e6 +
                             children.ru_stime.tv_sec + children.ru_stime.tv_usec / 1e6;
  const double child_maxrss_mib = children.ru_maxrss / 1024.0;
  std::filesystem::remove_all(state);
  std::filesystem::remove(state + ".stderr");

  const Percentiles gj = Summarize(get_job_ms), lw = Summarize(list_workers_ms);
  Percentiles fw;
  {
    std::lock_guard<std::mutex> lock(forward_mu);
    fw = Summarize(forward_ms);
  }
  const double cpu_pct = 100.0 * (after.cpu_s - before.cpu_s) / steady_s;

  std::printf("\n%-44s %12s\n", "measure", "value");
  std::printf("%-44s %12.2f\n", "connect workers (register+open) [s]", connect_s);
  std::printf("%-44s %12.1f\n", "SubmitJob incl. placement [ms]", submit_rpc_s * 1000);
  std::printf("%-44s %12.2f\n", "submit -> all assignments at workers [s]", assign_s);
  std::printf("%-44s %12.2f\n", "submit -> all ranks RUNNING [s]", running_s);
  std::printf("%-44s %12.0f\n", "session messages in [msg/s]", msgs_per_s);
  std::printf("%-44s %6.1f / %5.1f\n", "GetJob (all ranks) p50 / p99 [ms]", gj.p50, gj.p99);
  std::printf("%-44s %6.1f / %5.1f\n", "ListWorkers p50 / p99 [ms]", lw.p50, lw.p99);
  std::printf("%-44s %6.1f / %5.1f\n", "metrics worker->watcher p50 / p99 [ms]", fw.p50, fw.p99);
  std::printf("%-44s %12.1f\n", "coordinator CPU, steady state [% of a core]", cpu_pct);
  std::printf("%-44s %12.1f\n", "coordinator RSS, end of steady state [MiB]", after.rss_mib);
  std::printf("%-44s %12.1f\n", "coordinator peak RSS (getrusage) [MiB]", child_maxrss_mib);
  std::printf("%-44s %12.1f\n", "coordinator CPU, whole run (getrusage) [s]", child_cpu_s);
  std::printf("%-44s %12lld\n", "job-level samples streamed", static_cast<long long>(job_samples));
  std::printf("%-44s %12s\n", "coordinator exit on SIGTERM",
              exit_status && WIFEXITED(*exit_status) && WEXITSTATUS(*exit_status) == 0
                  ? "clean"
                  : "NOT clean");

  nlohmann::json out = {
      {"bench", "control_plane"},
      {"workers", cfg.workers},
      {"slots", cfg.slots},
      {"ranks", world},
      {"hz", cfg.hz},
      {"steady_seconds", steady_s},
      {"connect_s", connect_s},
      {"submit_rpc_ms", submit_rpc_s * 1000},
      {"place_assign_s", assign_s},
      {"all_running_s", running_s},
      {"session_msgs_per_s", msgs_per_s},
      {"get_job_ms", {{"p50", gj.p50}, {"p99", gj.p99}, {"n", gj.n}}},
      {"list_workers_ms", {{"p50", lw.p50}, {"p99", lw.p99}, {"n", lw.n}}},
      {"metrics_forward_ms", {{"p50", fw.p50}, {"p99", fw.p99}, {"n", fw.n}}},
      {"coordinator_cpu_pct", cpu_pct},
      {"coordinator_rss_mib", after.rss_mib},
      {"coordinator_peak_rss_mib", child_maxrss_mib},
      {"coordinator_cpu_total_s", child_cpu_s},
      {"job_samples", job_samples.load()},
  };
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace meshrun

int main(int argc, char** argv) {
  meshrun::Config cfg;
  CLI::App app{"control_plane: simulated workers against a real meshrun-coordinator"};
  app.add_option("--workers", cfg.workers, "simulated workers")->capture_default_str();
  app.add_option("--slots", cfg.slots, "slots per worker")->capture_default_str();
  app.add_option("--tp", cfg.tp, "tp_size of the job (divides --slots)")->capture_default_str();
  app.add_option("--seconds", cfg.seconds, "steady-state seconds")->capture_default_str();
  app.add_option("--hz", cfg.hz, "heartbeats (and metrics samples) per second per worker")
      ->capture_default_str();
  app.add_option("--coordinator", cfg.coordinator,
                 "meshrun-coordinator binary (default: next to this program)");
  CLI11_PARSE(app, argc, argv);
  if (cfg.coordinator.empty()) {
    cfg.coordinator =
        (std::filesystem::canonical("/proc/self/exe").parent_path() / "meshrun-coordinator")
            .string();
  }
  return meshrun::Run(cfg);
}
