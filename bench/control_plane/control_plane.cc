// Control-plane benchmark: a real meshrun-coordinator (the binary, as a child process) under
// simulated workers. W workers × S slots register and open WorkerSession streams (gRPC callback
// API, one connection each), spread over --generators load-generator processes (this program
// with --generator: several simulated workers per process, each with its own connection). An
// R-rank job is submitted and placed on all of them, and then every worker heartbeats at --hz
// with one RankMetrics per rank per beat while a client probes the job summary (GetJob with
// summary), a page of 500 ranks (ListRanks), a page of 500 workers (ListWorkers), the three
// taking turns at going first after each 100 ms pause, and follows the job with
// WatchJob(rank_metrics).
//
//   control_plane [--workers 1024] [--slots 8] [--tp 8] [--seconds 15] [--hz 1] [--unbatched]
//                 [--separate-heartbeats]
//                 [--generators 0 (auto: one per 256 workers)] [--coordinator PATH] [--cli PATH]
//                 [--coordinator-log FILE (its log at info: SubmitJob's phases)]
//                 [--generator-nice 0 (10: the generators yield the cores, as other hosts would)]
//
// Reports: time to connect the workers; SubmitJob latency (placement and persistence happen
// inside it) and the time until every assignment reached its worker and every rank was
// reported RUNNING; p50/p99 of the summary, the rank page and the worker page under load, and
// of the forwarding delay of a rank's metrics sample from its worker to a WatchJob client; the
// wall time of `meshrun status JOB` (summary and first page); the coordinator's CPU over the
// steady state (/proc/PID/stat before and after) divided by the session messages, by the
// rank samples and by the heartbeats and rank samples together (decision 0075) the generators
// sent in that window, and the generators' own CPU (getrusage in
// each, same window) likewise; the coordinator's RSS. A table, then one JSON line.
// Wall-clock figures from a shared machine: noisy.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
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
  int generators = 0;
  std::string coordinator;
  std::string cli;
  std::string coordinator_log;  // kept here, at --log-level info, when set
  bool unbatched = false;       // one session message per rank sample (before decision 0063)
  // The heartbeat in a message of its own, not on the step's batch (before decision 0070).
  bool separate_heartbeats = false;
  // The generators' nice value: 10 stands in for their being other hosts (the coordinator's
  // host keeps its cores for the coordinator and the probing client); 0: they compete.
  int generator_nice = 0;
  // --generator: this process is a load generator for workers [first, first + count).
  bool generator = false;
  std::string address;
  int first = 0;
  int count = 0;
};

double SelfCpuSeconds() {
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  return self.ru_utime.tv_sec + self.ru_utime.tv_usec / 1e6 + self.ru_stime.tv_sec +
         self.ru_stime.tv_usec / 1e6;
}

// SIGUSR1 opens the measured window, SIGUSR2 closes it (the main process sends them).
std::atomic<int> g_window_signal{0};
void OnWindowSignal(int sig) {
  g_window_signal = sig;
}

v1::SubmitJobRequest JobOfSize(int world, int tp) {
  // dp_replicate × dp_shard × tp with dp_shard up to 16: HSDP across workers.
  const int groups = world / tp;
  const int shard = std::min(16, groups);
  JobSpec spec;
  spec.name = "bench-job";
  spec.model.n_head = tp;
  spec.model.d_model = 8 * tp;
  spec.parallelism.dp_replicate_size = groups / shard;
  spec.parallelism.dp_shard_size = shard;
  spec.parallelism.tp_size = tp;
  spec.train.steps = 1000;
  spec.train.global_batch_size = groups;
  spec.train.micro_batch_size = 1;
  spec.data.train = "/data/bench.txt";
  v1::SubmitJobRequest req;
  *req.mutable_spec() = meshrun::JobSpecToProto(spec);
  req.set_request_id("bench-1");
  return req;
}

// ---- Load generator -------------------------------------------------------------------------

// Prints "ready", "assigned <ranks> <unix ns of the last>" once every worker got its ranks, and
// "window sent=<messages> samples=<rank samples> heartbeats=<heartbeats> cpu=<seconds>" after
// SIGUSR2.
int RunGenerator(const Config& cfg) {
  if (cfg.generator_nice != 0 && setpriority(PRIO_PROCESS, 0, cfg.generator_nice) != 0) {
    std::perror("setpriority");
  }
  signal(SIGUSR1, OnWindowSignal);
  signal(SIGUSR2, OnWindowSignal);
  const int expected_ranks = cfg.count * cfg.slots;
  std::atomic<int> assigned{0};
  std::vector<std::unique_ptr<SimWorker>> sims(cfg.count);
  for (int i = 0; i < cfg.count; ++i) {
    auto sim = std::make_unique<SimWorker>();
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // one connection per worker
    auto channel = grpc::CreateCustomChannel(cfg.address, grpc::InsecureChannelCredentials(), args);
    char name[32];
    std::snprintf(name, sizeof(name), "sim-%05d", cfg.first + i);
    sim->worker = std::make_unique<testing::FakeGrpcWorker>(channel, name, cfg.slots);
    SimWorker* raw = sim.get();
    // What meshrun-worker measures and registers (worker/main.cc): the planner's figures for
    // the host, so that SubmitJob's prediction uses them (not a GEMM timed in the coordinator).
    v1::HostCalibration calibration;
    calibration.set_gemm_flops(2e10);
    calibration.set_loopback_bus_bandwidth(5e9);
    calibration.set_loopback_latency_seconds(2e-5);
    calibration.set_loopback_ranks(4);
    sim->worker->set_calibration(calibration);
    sim->worker->set_keep_messages(false);
    sim->worker->set_on_message([raw, &assigned,
                                 expected_ranks](const v1::WorkerSessionResponse& m) {
      if (!m.has_assign()) return;
      {
        std::lock_guard<std::mutex> lock(raw->mu);
        raw->ranks.push_back(m.assign());
      }
      raw->worker->Started(m.assign(), 10'000 + m.assign().rank());
      if (++assigned == expected_ranks) {
        std::printf("assigned %d %lld\n", expected_ranks,
                    static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::system_clock::now().time_since_epoch())
                                               .count()));
        std::fflush(stdout);
      }
    });
    grpc::Status s = sim->worker->Register(seconds(60));
    if (!s.ok()) {
      std::fprintf(stderr, "error: register %s: %s\n", name, s.error_message().c_str());
      return 1;
    }
    sim->worker->Open();
    sims[i] = std::move(sim);
  }
  std::printf("ready\n");
  std::fflush(stdout);

  std::atomic<bool> stop{false};
  std::atomic<int64_t> sent{0}, samples{0}, heartbeats{0};
  std::thread driver([&] {
    const auto period = std::chrono::duration<double>(1.0 / cfg.hz);
    // Generators start their periods at different offsets, as independent hosts would.
    auto next = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   period * (static_cast<double>(cfg.first % 97) / 97.0));
    for (int64_t tick = 1; !stop; ++tick) {
      for (int i = 0; i < cfg.count && !stop; ++i) {
        std::this_thread::sleep_until(next + std::chrono::duration_cast<Clock::duration>(
                                                 period * (static_cast<double>(i) / cfg.count)));
        SimWorker& sim = *sims[i];
        std::vector<v1::RankAssignment> ranks;
        {
          std::lock_guard<std::mutex> lock(sim.mu);
          ranks = sim.ranks;
        }
        std::vector<v1::RunningRank> running;
        for (const auto& a : ranks) running.push_back(testing::FakeGrpcWorker::Running(a));
        // As meshrun-worker sends it to this coordinator (SessionAccepted.heartbeat_with_metrics):
        // on the step's batch; alone before the ranks run, --unbatched or --separate-heartbeats.
        const bool carried = !cfg.unbatched && !cfg.separate_heartbeats && !ranks.empty();
        if (!carried) {
          sim.worker->Heartbeat(running);
          ++sent;
          ++heartbeats;
        }
        // As meshrun-worker sends them to this coordinator (SessionAccepted.metrics_batches):
        // the worker's ranks' samples of the step in one RankMetrics; --unbatched: one each.
        v1::WorkerSessionRequest batch;
        for (const auto& a : ranks) {
          v1::WorkerSessionRequest m;
          v1::MetricsSample* s = cfg.unbatched ? m.mutable_metrics()->mutable_sample()
                                               : batch.mutable_metrics()->add_samples();
          s->set_job_id(a.job_id());
          s->set_attempt(a.attempt());
          s->set_rank(a.rank());
          s->set_step(tick);
          coordinator::SetTimestamp(std::chrono::system_clock::now(), s->mutable_time());
          s->set_loss(3.0);
          s->set_step_seconds(1.0 / cfg.hz);
          s->set_tokens_per_second(1000);
          s->set_mfu(0.4);
          ++samples;
          if (cfg.unbatched) {
            sim.worker->Send(m);
            ++sent;
          }
        }
        if (!cfg.unbatched && !ranks.empty()) {
          if (carried)
            *batch.mutable_metrics()->mutable_heartbeat() = sim.worker->HeartbeatOf(running);
          heartbeats += carried ? 1 : 0;
          sim.worker->Send(batch);
          ++sent;
        }
      }
      next += std::chrono::duration_cast<Clock::duration>(period);
    }
  });
  int64_t sent0 = 0, samples0 = 0, heartbeats0 = 0;
  double cpu0 = 0;
  while (true) {
    const int sig = g_window_signal.exchange(0);
    if (sig == SIGUSR1) {
      sent0 = sent;
      samples0 = samples;
      heartbeats0 = heartbeats;
      cpu0 = SelfCpuSeconds();
    } else if (sig == SIGUSR2) {
      std::printf("window sent=%lld samples=%lld heartbeats=%lld cpu=%.4f\n",
                  static_cast<long long>(sent - sent0), static_cast<long long>(samples - samples0),
                  static_cast<long long>(heartbeats - heartbeats0), SelfCpuSeconds() - cpu0);
      std::fflush(stdout);
      break;
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
  stop = true;
  driver.join();
  // The main process kills the generators after it stopped the coordinator.
  while (true) std::this_thread::sleep_for(seconds(1));
}

// ---- Main: coordinator, generators, probes ----------------------------------------------------

// Reads a generator's stdout lines on a thread of its own.
struct Generator {
  std::unique_ptr<testing::Subprocess> process;
  std::thread reader;
  std::mutex mu;
  bool ready = false;
  int64_t assigned_ns = 0;
  int64_t window_sent = -1, window_samples = 0, window_heartbeats = 0;
  double window_cpu = 0;
};

int Run(const Config& cfg) {
  const int world = cfg.workers * cfg.slots;
  if (world % cfg.tp != 0 || cfg.slots % cfg.tp != 0) {
    std::fprintf(stderr, "error: --tp: %d must divide --slots (%d)\n", cfg.tp, cfg.slots);
    return 2;
  }
  // 2 descriptors per worker here and in the coordinator (which raises its own limit).
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 &&
      files.rlim_cur < static_cast<rlim_t>(cfg.workers) + 256) {
    std::fprintf(stderr,
                 "error: --workers: %d connections need more open files than the limit %llu "
                 "(hint: raise `ulimit -n`, hard limit included)\n",
                 cfg.workers, static_cast<unsigned long long>(files.rlim_cur));
    return 2;
  }
  const int generators =
      cfg.generators > 0 ? cfg.generators : std::max(1, (cfg.workers + 255) / 256);
  const std::string state =
      (std::filesystem::temp_directory_path() / ("meshrun-bench-cp-" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(state);
  testing::Subprocess coord({cfg.coordinator, "--listen", "127.0.0.1:0", "--metrics-listen",
                             "127.0.0.1:0", "--state-dir", state, "--heartbeat-timeout", "30",
                             "--log-level", cfg.coordinator_log.empty() ? "warn" : "info"},
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
  std::printf(
      "coordinator %s (pid %d), %d workers x %d slots in %d generator processes (nice %d), "
      "%d-rank job\n",
      address.c_str(), coord.pid(), cfg.workers, cfg.slots, generators, cfg.generator_nice, world);
  std::fflush(stdout);

  // ---- Connect the workers, a share per generator process ------------------------------------
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  std::vector<std::unique_ptr<Generator>> gens(generators);
  const auto t_connect = Clock::now();
  for (int g = 0; g < generators; ++g) {
    const int begin = static_cast<int>(static_cast<int64_t>(cfg.workers) * g / generators);
    const int end = static_cast<int>(static_cast<int64_t>(cfg.workers) * (g + 1) / generators);
    auto gen = std::make_unique<Generator>();
    char hz[32];
    std::snprintf(hz, sizeof(hz), "%g", cfg.hz);
    std::vector<std::string> args{self,        "--generator",
                                  "--address", address,
                                  "--first",   std::to_string(begin),
                                  "--count",   std::to_string(end - begin),
                                  "--slots",   std::to_string(cfg.slots),
                                  "--hz",      hz};
    if (cfg.unbatched) args.push_back("--unbatched");
    if (cfg.separate_heartbeats) args.push_back("--separate-heartbeats");
    args.insert(args.end(), {"--generator-nice", std::to_string(cfg.generator_nice)});
    gen->process =
        std::make_unique<testing::Subprocess>(args, state + ".gen" + std::to_string(g) + ".stderr");
    Generator* raw = gen.get();
    gen->reader = std::thread([raw] {
      while (true) {
        std::optional<std::string> line = raw->process->ReadLine(seconds(3600));
        if (!line) return;
        std::lock_guard<std::mutex> lock(raw->mu);
        long long a = 0, b = 0, h = 0;
        double c = 0;
        if (*line == "ready") {
          raw->ready = true;
        } else if (std::sscanf(line->c_str(), "assigned %lld %lld", &a, &b) == 2) {
          raw->assigned_ns = b;
        } else if (std::sscanf(line->c_str(),
                               "window sent=%lld samples=%lld heartbeats=%lld cpu=%lf", &a, &b, &h,
                               &c) == 4) {
          raw->window_sent = a;
          raw->window_samples = b;
          raw->window_heartbeats = h;
          raw->window_cpu = c;
          return;
        }
      }
    });
    gens[g] = std::move(gen);
  }
  auto teardown = [&] {
    for (auto& g : gens) g->process->Signal(SIGKILL);
    for (auto& g : gens) {
      g->process->Wait(seconds(10));
      if (g->reader.joinable()) g->reader.join();
    }
  };
  auto all = [&](auto pred) {
    for (auto& g : gens) {
      std::lock_guard<std::mutex> lock(g->mu);
      if (!pred(*g)) return false;
    }
    return true;
  };
  while (!all([](const Generator& g) { return g.ready; })) {
    if (Since(t_connect) > 300) {
      std::fprintf(stderr, "error: workers did not all register within 300 s (see %s.gen*)\n",
                   state.c_str());
      teardown();
      return 1;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::CoordinatorService::NewStub(channel);
  auto list_workers = [&](const v1::ListWorkersRequest& req, v1::ListWorkersResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
    return stub->ListWorkers(&ctx, req, out);
  };
  // Every worker's session open: count them a page at a time.
  while (true) {
    int n = 0;
    v1::ListWorkersRequest req;
    req.set_page_size(1000);
    v1::ListWorkersResponse resp;
    while (list_workers(req, &resp).ok()) {
      n += resp.workers_size();
      if (resp.next_page_token().empty()) break;
      req.set_page_token(resp.next_page_token());
      resp.Clear();
    }
    if (n == cfg.workers) break;
    if (Since(t_connect) > 300) {
      std::fprintf(stderr, "error: %d of %d workers registered after 300 s\n", n, cfg.workers);
      teardown();
      return 1;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  const double connect_s = Since(t_connect);

  // ---- Place and assign the job --------------------------------------------------------------
  const auto submit_wall = std::chrono::system_clock::now();
  const auto t_submit = Clock::now();
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(120));
    grpc::Status s = stub->SubmitJob(&ctx, JobOfSize(world, cfg.tp), &submitted);
    if (!s.ok()) {
      std::fprintf(stderr, "error: SubmitJob: %s\n", s.error_message().c_str());
      teardown();
      return 1;
    }
  }
  const double submit_rpc_s = Since(t_submit);
  auto get_summary = [&](v1::GetJobResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
    v1::GetJobRequest req;
    req.set_job_id(submitted.job_id());
    req.set_summary(true);
    return stub->GetJob(&ctx, req, out);
  };
  auto list_ranks = [&](const std::string& token, v1::ListRanksResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
    v1::ListRanksRequest req;
    req.set_job_id(submitted.job_id());
    req.set_page_size(500);
    req.set_page_token(token);
    return stub->ListRanks(&ctx, req, out);
  };
  auto running_ranks = [&](const v1::GetJobResponse& resp) {
    for (const auto& c : resp.rank_states()) {
      if (c.state() == v1::RANK_STATE_RUNNING) return c.ranks();
    }
    return 0;
  };
  double running_s = -1;
  while (Since(t_submit) < 300) {
    v1::GetJobResponse resp;
    if (get_summary(&resp).ok() && running_ranks(resp) == world) {
      running_s = Since(t_submit);
      break;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  int64_t last_assign_ns = 0;
  all([&](const Generator& g) {
    last_assign_ns = std::max(last_assign_ns, g.assigned_ns);
    return true;
  });
  const double assign_s =
      last_assign_ns == 0
          ? -1
          : (last_assign_ns -
             std::chrono::duration_cast<std::chrono::nanoseconds>(submit_wall.time_since_epoch())
                 .count()) /
                1e9;

  // ---- Steady state: probes and a watcher ------------------------------------------------------
  std::vector<double> summary_ms, rank_page_ms, worker_page_ms, forward_ms;
  std::mutex forward_mu;
  std::atomic<bool> measuring{false};
  std::atomic<int64_t> job_samples{0};
  grpc::ClientContext watch_ctx;
  std::thread watcher([&] {
    v1::WatchJobRequest req;
    req.set_job_id(submitted.job_id());
    req.set_rank_metrics(true);
    req.set_skip_logs(true);
    req.set_batch_events(true);  // a dashboard of every rank's metrics asks for batches
    v1::GetJobResponse now;
    if (get_summary(&now).ok()) req.set_from_sequence(now.job().last_event_sequence() + 1);
    auto reader = stub->WatchJob(&watch_ctx, req);
    v1::WatchJobResponse resp;
    auto take = [&](const v1::JobEvent& event, std::chrono::system_clock::time_point now) {
      if (!event.has_metrics()) return;
      const v1::MetricsSample& s = event.metrics();
      if (!s.has_rank()) {
        ++job_samples;
        return;
      }
      if (!measuring) return;
      const auto sent_at = std::chrono::system_clock::time_point(
          std::chrono::seconds(s.time().seconds()) + std::chrono::nanoseconds(s.time().nanos()));
      const double ms = std::chrono::duration<double, std::milli>(now - sent_at).count();
      std::lock_guard<std::mutex> lock(forward_mu);
      forward_ms.push_back(ms);
    };
    while (reader->Read(&resp)) {
      // Every event of a batch arrived when the response did.
      const auto now = std::chrono::system_clock::now();
      take(resp.event(), now);
      for (const v1::JobEvent& e : resp.more_events()) take(e, now);
    }
    (void)reader->Finish();
  });

  std::this_thread::sleep_for(milliseconds(static_cast<int>(1500 / cfg.hz)));  // settle
  for (auto& g : gens) g->process->Signal(SIGUSR1);
  const ProcStats before = ReadProc(coord.pid());
  const auto t_steady = Clock::now();
  measuring = true;
  std::mt19937 random(7);
  const int pages = std::max(1, world / 500);
  // The three probes take turns at going first: the first call after the pause also pays for
  // waking the client and finding a core on a machine the generators keep busy.
  for (int round = 0; Since(t_steady) < cfg.seconds; ++round) {
    auto summary = [&] {
      const auto t0 = Clock::now();
      v1::GetJobResponse job;
      if (get_summary(&job).ok()) summary_ms.push_back(Since(t0) * 1000);
    };
    // A page of 500 ranks somewhere in the job (the token names the first rank of the page).
    auto rank_page = [&] {
      const int page = static_cast<int>(random() % pages);
      const auto t0 = Clock::now();
      v1::ListRanksResponse ranks;
      if (list_ranks(page == 0 ? "" : "a1r" + std::to_string(page * 500), &ranks).ok() &&
          ranks.ranks_size() > 0) {
        rank_page_ms.push_back(Since(t0) * 1000);
      }
    };
    // A page of 500 workers after a random one.
    auto worker_page = [&] {
      char after[48];
      std::snprintf(after, sizeof(after), "after:sim-%05d",
                    static_cast<int>(random() % std::max(1, cfg.workers - 500)));
      v1::ListWorkersRequest wreq;
      wreq.set_page_size(500);
      wreq.set_page_token(after);
      const auto t0 = Clock::now();
      v1::ListWorkersResponse workers;
      if (list_workers(wreq, &workers).ok()) worker_page_ms.push_back(Since(t0) * 1000);
    };
    const std::function<void()> probes[3] = {summary, rank_page, worker_page};
    for (int i = 0; i < 3; ++i) probes[(round + i) % 3]();
    std::this_thread::sleep_for(milliseconds(100));
  }
  measuring = false;
  const double steady_s = Since(t_steady);
  const ProcStats after = ReadProc(coord.pid());
  for (auto& g : gens) g->process->Signal(SIGUSR2);
  const auto t_window = Clock::now();
  while (!all([](const Generator& g) { return g.window_sent >= 0; }) && Since(t_window) < 30) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  int64_t window_sent = 0, window_samples = 0, window_heartbeats = 0;
  double generators_cpu_s = 0;
  all([&](const Generator& g) {
    window_sent += std::max<int64_t>(0, g.window_sent);
    window_samples += g.window_samples;
    window_heartbeats += g.window_heartbeats;
    generators_cpu_s += g.window_cpu;
    return true;
  });

  // `meshrun status JOB`: the summary and the first page of ranks, as a user runs it.
  double status_s = -1;
  if (!cfg.cli.empty() && std::filesystem::exists(cfg.cli)) {
    for (int i = 0; i < 3; ++i) {
      const auto t0 = Clock::now();
      const std::string command = "'" + cfg.cli + "' status " + submitted.job_id() +
                                  " --coordinator " + address + " --page-size 500 >/dev/null";
      if (std::system(command.c_str()) == 0) status_s = std::max(status_s, Since(t0));
    }
  }

  // ---- Tear down and account the child ------------------------------------------------------
  watch_ctx.TryCancel();
  watcher.join();
  coord.Signal(SIGTERM);
  auto exit_status = coord.Wait(seconds(60));
  teardown();
  std::filesystem::remove_all(state);
  if (!cfg.coordinator_log.empty()) {
    std::filesystem::copy_file(state + ".stderr", cfg.coordinator_log,
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::filesystem::remove(state + ".stderr");
  for (int g = 0; g < generators; ++g) {
    std::filesystem::remove(state + ".gen" + std::to_string(g) + ".stderr");
  }

  const Percentiles sm = Summarize(summary_ms), rp = Summarize(rank_page_ms),
                    wp = Summarize(worker_page_ms);
  Percentiles fw;
  {
    std::lock_guard<std::mutex> lock(forward_mu);
    fw = Summarize(forward_ms);
  }
  const double coord_cpu_s = after.cpu_s - before.cpu_s;
  const double cpu_pct = 100.0 * coord_cpu_s / steady_s;
  const double msgs_per_s = window_sent / steady_s;
  const double us_per_msg = window_sent > 0 ? 1e6 * coord_cpu_s / window_sent : 0;
  const double us_per_sample = window_samples > 0 ? 1e6 * coord_cpu_s / window_samples : 0;
  const double gen_us_per_msg = window_sent > 0 ? 1e6 * generators_cpu_s / window_sent : 0;
  // What a session message was when every heartbeat and every rank sample travelled alone (and
  // still do under --unbatched --separate-heartbeats): the coordinator's CPU per item it ingests.
  const int64_t items = window_samples + window_heartbeats;
  const double us_per_item = items > 0 ? 1e6 * coord_cpu_s / items : 0;
  const double gen_us_per_sample = window_samples > 0 ? 1e6 * generators_cpu_s / window_samples : 0;

  std::printf("\n%-48s %12s\n", "measure", "value");
  std::printf("%-48s %12.2f\n", "connect workers (register+open) [s]", connect_s);
  std::printf("%-48s %12.1f\n", "SubmitJob incl. placement+persistence [ms]", submit_rpc_s * 1000);
  std::printf("%-48s %12.2f\n", "submit -> all assignments at workers [s]", assign_s);
  std::printf("%-48s %12.2f\n", "submit -> all ranks RUNNING [s]", running_s);
  std::printf("%-48s %12.0f\n", "session messages in [msg/s]", msgs_per_s);
  std::printf("%-48s %12.0f\n",
              cfg.unbatched ? "rank samples in, one per message [1/s]"
                            : "rank samples in, a worker's per message [1/s]",
              window_samples / steady_s);
  std::printf("%-48s %6.2f / %5.2f\n", "job summary (GetJob summary) p50 / p99 [ms]", sm.p50,
              sm.p99);
  std::printf("%-48s %6.2f / %5.2f\n", "page of 500 ranks (ListRanks) p50 / p99 [ms]", rp.p50,
              rp.p99);
  std::printf("%-48s %6.2f / %5.2f\n", "page of 500 workers (ListWorkers) p50/p99 [ms]", wp.p50,
              wp.p99);
  std::printf("%-48s %6.1f / %5.1f\n", "metrics worker->watcher p50 / p99 [ms]", fw.p50, fw.p99);
  std::printf("%-48s %12.2f\n", "`meshrun status JOB` (slowest of 3) [s]", status_s);
  std::printf("%-48s %12.1f\n", "coordinator CPU, steady state [% of a core]", cpu_pct);
  std::printf("%-48s %12.2f\n", "coordinator CPU per session message [us]", us_per_msg);
  std::printf("%-48s %12.2f\n", "coordinator CPU per rank sample [us]", us_per_sample);
  std::printf("%-48s %12.2f\n", "coordinator CPU per heartbeat or rank sample [us]", us_per_item);
  std::printf("%-48s %12.2f\n", "load generators' CPU per session message [us]", gen_us_per_msg);
  std::printf("%-48s %12.2f\n", "load generators' CPU per rank sample [us]", gen_us_per_sample);
  std::printf("%-48s %12.1f\n", "coordinator RSS, end of steady state [MiB]", after.rss_mib);
  std::printf("%-48s %12lld\n", "job-level samples streamed", static_cast<long long>(job_samples));
  std::printf("%-48s %12s\n", "coordinator exit on SIGTERM",
              exit_status && WIFEXITED(*exit_status) && WEXITSTATUS(*exit_status) == 0
                  ? "clean"
                  : "NOT clean");

  nlohmann::json out = {
      {"bench", "control_plane"},
      {"workers", cfg.workers},
      {"slots", cfg.slots},
      {"ranks", world},
      {"generators", generators},
      {"generator_nice", cfg.generator_nice},
      {"hz", cfg.hz},
      {"steady_seconds", steady_s},
      {"connect_s", connect_s},
      {"submit_rpc_ms", submit_rpc_s * 1000},
      {"place_assign_s", assign_s},
      {"all_running_s", running_s},
      {"session_msgs_per_s", msgs_per_s},
      {"rank_samples_per_s", window_samples / steady_s},
      {"metrics_batched", !cfg.unbatched},
      {"heartbeat_on_batch", !cfg.unbatched && !cfg.separate_heartbeats},
      {"summary_ms", {{"p50", sm.p50}, {"p99", sm.p99}, {"n", sm.n}}},
      {"rank_page_ms", {{"p50", rp.p50}, {"p99", rp.p99}, {"n", rp.n}}},
      {"worker_page_ms", {{"p50", wp.p50}, {"p99", wp.p99}, {"n", wp.n}}},
      {"metrics_forward_ms", {{"p50", fw.p50}, {"p99", fw.p99}, {"n", fw.n}}},
      {"status_cli_s", status_s},
      {"coordinator_cpu_pct", cpu_pct},
      {"coordinator_us_per_msg", us_per_msg},
      {"coordinator_us_per_item", us_per_item},
      {"heartbeats_per_s", window_heartbeats / steady_s},
      {"coordinator_us_per_rank_sample", us_per_sample},
      {"generators_us_per_msg", gen_us_per_msg},
      {"generators_us_per_rank_sample", gen_us_per_sample},
      {"coordinator_rss_mib", after.rss_mib},
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
  app.add_option("--generators", cfg.generators,
                 "load-generator processes (0: one per 256 workers)")
      ->capture_default_str();
  app.add_option("--coordinator", cfg.coordinator,
                 "meshrun-coordinator binary (default: next to this program)");
  app.add_option("--cli", cfg.cli,
                 "meshrun binary timed for `status` (default: next to this program)");
  app.add_option("--coordinator-log", cfg.coordinator_log,
                 "keep the coordinator's log (at --log-level info) in this file");
  app.add_flag("--unbatched", cfg.unbatched,
               "one session message per rank sample (default: a worker's samples of a step in "
               "one RankMetrics, as meshrun-worker sends them)");
  app.add_flag("--separate-heartbeats", cfg.separate_heartbeats,
               "a worker's heartbeat in a message of its own (default: on the step's batch of "
               "samples, as meshrun-worker sends it to a coordinator that reads it there)");
  app.add_option("--generator-nice", cfg.generator_nice,
                 "the load generators' nice value (10: they stand in for other hosts and leave "
                 "the coordinator's cores to it; 0: they compete with it)")
      ->capture_default_str();
  // Internal: one load-generator process (started by the main process).
  app.add_flag("--generator", cfg.generator)->group("");
  app.add_option("--address", cfg.address)->group("");
  app.add_option("--first", cfg.first)->group("");
  app.add_option("--count", cfg.count)->group("");
  CLI11_PARSE(app, argc, argv);
  if (cfg.generator) return meshrun::RunGenerator(cfg);
  const auto here = std::filesystem::canonical("/proc/self/exe").parent_path();
  if (cfg.coordinator.empty()) cfg.coordinator = (here / "meshrun-coordinator").string();
  if (cfg.cli.empty()) cfg.cli = (here / "meshrun").string();
  return meshrun::Run(cfg);
}
