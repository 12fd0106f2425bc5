// `meshrun demo` (see demo_command.h).
#include "client/demo_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "client/coordinator_client.h"
#include "client/generate_command.h"
#include "client/progress.h"
#include "client/submit_command.h"
#include "client/up_command.h"
#include "proto/mesh_axis.h"

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// examples/demo.yaml, embedded at build time so the demo runs from any folder.
constexpr char kDemoYaml[] =
#include "gen/client/demo_spec.inc"
    ;

struct DemoFlags {
  std::string file;  // empty: the embedded examples/demo.yaml
  std::vector<std::string> overrides;
  int workers = 2;
  int slots = 2;
  std::string dir;  // empty: a new /tmp/meshrun-demo-XXXXXX
};

// Stops the cluster and leaves on SIGINT/SIGTERM while the main thread follows the job.
class InterruptWatcher {
 public:
  InterruptWatcher(const sigset_t& signals, LocalCluster* cluster)
      : thread_([this, signals, cluster] {
          while (!done_) {
            timespec tick{0, 200 * 1000 * 1000};
            const int sig = sigtimedwait(&signals, nullptr, &tick);
            if (sig == SIGINT || sig == SIGTERM) {
              std::cerr << "\ninterrupted (signal " << sig << "); stopping the cluster"
                        << std::endl;
              cluster->Stop();
              std::_Exit(kExitFailure);
            }
          }
        }) {}
  ~InterruptWatcher() {
    done_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

int RunDemo(const DemoFlags& f) {
  const Clock::time_point t0 = Clock::now();
  std::string dir = f.dir;
  if (dir.empty()) {
    char tmp[] = "/tmp/meshrun-demo-XXXXXX";
    if (mkdtemp(tmp) == nullptr)
      return ReportError(InternalError("demo: cannot create a temporary folder"));
    dir = tmp;
  }
  dir = fs::absolute(dir).string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string spec_file = f.file;
  if (spec_file.empty()) {
    spec_file = dir + "/demo.yaml";
    std::ofstream(spec_file) << kDemoYaml;
  }
  std::vector<std::string> overrides = {"checkpoint.dir=" + dir + "/checkpoints"};
  overrides.insert(overrides.end(), f.overrides.begin(), f.overrides.end());
  StatusOr<v1::JobSpec> spec = PrepareSubmission(spec_file, overrides);
  if (!spec.ok()) return ReportError(spec.status());

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::cout << "meshrun demo: a local cluster of 1 coordinator and " << f.workers << " workers x "
            << f.slots << " CPU slots\n  folder " << dir << " (daemon logs in " << dir << "/logs)"
            << std::endl;
  LocalClusterOptions options;
  options.workers = f.workers;
  options.slots = f.slots;
  options.state_dir = dir + "/state";
  options.work_dir = dir + "/work";
  options.log_dir = dir + "/logs";
  StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  if (!cluster.ok()) return ReportError(cluster.status());
  InterruptWatcher watcher(signals, cluster->get());
  std::cout << "  coordinator " << (*cluster)->coordinator_address() << " ready\n";

  const v1::ModelSpec& m = spec->model();
  const v1::ParallelismSpec& p = spec->parallelism();
  const int world = p.dp_replicate_size() * p.dp_shard_size() * p.cp_size() * p.tp_size();
  std::printf(
      "job: GPT-2 %d layers, d_model %d, %d heads, seq_len %d; %lld steps of %lld "
      "sequences\n     mesh dp_replicate %d x dp_shard %d x cp %d x tp %d = %d ranks; data "
      "%s\n",
      m.n_layer(), m.d_model(), m.n_head(), m.seq_len(),
      static_cast<long long>(spec->train().steps()),
      static_cast<long long>(spec->train().global_batch_size()), p.dp_replicate_size(),
      p.dp_shard_size(), p.cp_size(), p.tp_size(), world, spec->data().train().c_str());
  std::fflush(stdout);

  auto finish = [&](int code) {
    (*cluster)->Stop();
    return code;
  };
  StatusOr<std::unique_ptr<CoordinatorClient>> client =
      CoordinatorClient::Connect((*cluster)->coordinator_address(), LocalConnection());
  if (!client.ok()) return finish(ReportError(client.status()));
  StatusOr<std::string> job_id = (*client)->SubmitJob(*spec, NewRequestId());
  if (!job_id.ok()) return finish(ReportError(job_id.status()));
  std::cout << "submitted job " << EscapeText(*job_id) << std::endl;

  FollowOptions follow;
  follow.terminal = StdoutIsTerminal();
  StatusOr<FollowResult> followed = FollowJob(**client, *job_id, follow);
  if (!followed.ok()) return finish(ReportError(followed.status()));
  const v1::Job& job = followed->job;

  // Where the ranks ran.
  if (StatusOr<v1::Job> full = (*client)->GetJob(*job_id); full.ok() && full->ranks_size() > 0) {
    // The mesh order, as in `status` and `validate`.
    const bool pipelined = RankPipelined(full->ranks(0));
    std::vector<std::string> header = {"  RANK", "WORKER"};
    for (std::string& h : RankAxisHeaders(pipelined)) header.push_back(std::move(h));
    header.push_back("STATE");
    std::vector<std::vector<std::string>> rows = {std::move(header)};
    for (const v1::RankInfo& r : full->ranks()) {
      std::vector<std::string> row = {"  " + std::to_string(r.rank()), r.worker_name()};
      for (std::string& cell : RankAxisCells(r, pipelined)) row.push_back(std::move(cell));
      row.push_back(RankStateName(r.state()));
      rows.push_back(std::move(row));
    }
    PrintTable(std::cout, rows);
  }

  const bool succeeded = job.state() == v1::JOB_STATE_SUCCEEDED;
  std::string model_dir;
  if (succeeded && !followed->last_checkpoint.empty()) {
    model_dir = dir + "/model";
    const int rc =
        RunToEnd({BinaryDir() + "/meshrun", "export", followed->last_checkpoint, "-o", model_dir});
    if (rc != 0) {
      std::cerr << "error: export: `meshrun export " << EscapeText(followed->last_checkpoint)
                << " -o " << model_dir << "` exited with " << rc << std::endl;
      model_dir.clear();
    }
  }
  // What the model learned: a short sample of it.
  std::string sample;
  if (!model_dir.empty()) {
    StatusOr<std::string> s = SampleFromModel(model_dir, "The ", 48);
    sample = s.ok() ? *s : "(" + s.status().message() + ")";
    for (char& c : sample) {
      if (c == '\n' || c == '\t') c = ' ';
    }
  }
  (*cluster)->Stop();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();

  const auto& loss = followed->loss;
  char text[512];
  std::cout << "\nsummary\n";
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"  job", job.job_id() + "  " + JobStateName(job.state()) +
                               (job.message().empty() ? "" : ": " + job.message())});
  rows.push_back({"  steps", std::to_string(job.step()) + "/" + std::to_string(job.steps()) +
                                 ", restarts " + std::to_string(job.restarts())});
  if (!loss.empty()) {
    std::snprintf(text, sizeof(text), "%.4f (step %lld) -> %.4f (step %lld)", loss.begin()->second,
                  static_cast<long long>(loss.begin()->first), loss.rbegin()->second,
                  static_cast<long long>(loss.rbegin()->first));
    rows.push_back({"  loss", text});
  }
  std::snprintf(text, sizeof(text),
                "%.0f tokens/s, MFU %.2f%% (over all steps: tokens / step time)",
                followed->tokens_per_second, 100.0 * followed->mfu);
  rows.push_back({"  throughput", text});
  rows.push_back(
      {"  checkpoint", followed->last_checkpoint.empty() ? "-" : followed->last_checkpoint});
  rows.push_back(
      {"  model", model_dir.empty() ? "-" : model_dir + " (model.safetensors, config.json)"});
  if (!sample.empty()) rows.push_back({"  sample", "\"" + sample + "\""});
  rows.push_back({"  wall time", FormatDuration(wall)});
  PrintTable(std::cout, rows);
  return succeeded && !model_dir.empty() ? kExitOk : kExitFailure;
}

}  // namespace

void RegisterDemoCommand(CLI::App& app, CommandResult& result) {
  auto f = std::make_shared<DemoFlags>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Start a local cluster, train the bundled job with live progress, export it");
  cmd->add_option("-f,--file", f->file, "job spec to run instead of examples/demo.yaml");
  cmd->add_option("--set", f->overrides, "override a field: dotted.path=value (repeatable)")
      ->expected(1)
      ->take_all();
  cmd->add_option("--workers", f->workers, "workers of the local cluster")
      ->check(WholeNumber(1, 64));
  cmd->add_option("--slots", f->slots, "slots per worker")->check(WholeNumber(1, 1024));
  cmd->add_option("--dir", f->dir,
                  "folder for state, checkpoints, logs and the exported model "
                  "(default: a new /tmp/meshrun-demo-XXXXXX)");
  cmd->callback([f, &result] { result.run = [f] { return RunDemo(*f); }; });
}

}  // namespace meshrun::client
