// `meshrun submit` (see submit_command.h).
#include "client/submit_command.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>

#include "client/coordinator_client.h"
#include "client/plan_support.h"
#include "client/preflight.h"
#include "client/progress.h"
#include "client/validate_command.h"
#include "common/job_spec_yaml.h"
#include "proto/spec_convert.h"

namespace meshrun::client {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct SubmitFlags {
  std::string file;
  std::vector<std::string> overrides;
  bool follow = false;
  bool logs = false;
  bool skip_local_checks = false;
  bool wait_for_capacity = false;
  bool dry_run = false;
  std::string output = "text";
  std::string coordinator;
};

void MakeAbsolute(std::string& path) {
  if (path.empty() || fs::path(path).is_absolute()) return;
  path = fs::absolute(path).lexically_normal().string();
}

int RunSubmit(const SubmitFlags& f) {
  StatusOr<v1::JobSpec> spec = PrepareSubmission(f.file, f.overrides, !f.skip_local_checks);
  if (!spec.ok()) return ReportError(spec.status());
  StatusOr<std::unique_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(f.coordinator);
  if (!client.ok()) return ReportError(client.status());
  const bool as_json = f.output == "json";
  // The planner is the coordinator's (decision 0048): with parallelism.auto, a dry run answers
  // its choice for the registered workers, which is checked here and then submitted as it is.
  if (spec->parallelism().auto_()) {
    v1::SubmitJobRequest ask;
    *ask.mutable_spec() = *spec;
    ask.set_dry_run(true);
    ask.set_wait_for_capacity(f.wait_for_capacity);
    StatusOr<v1::SubmitJobResponse> planned = (*client)->SubmitJob(ask);
    if (!planned.ok()) return ReportError(planned.status());
    *spec = planned->spec();
  }
  if (const std::string& auto_note = spec->auto_choice(); !auto_note.empty()) {
    std::cerr << EscapeText(auto_note) << std::endl;
    if (!f.skip_local_checks) {
      StatusOr<JobSpec> chosen = JobSpecFromProto(*spec);
      if (!chosen.ok()) return ReportError(chosen.status());
      StatusOr<ParallelDims> mesh = MeshOf(*chosen);
      if (!mesh.ok()) return ReportError(mesh.status());
      if (Status s = CheckBeforeTraining(*chosen, *mesh); !s.ok()) return ReportError(s);
    }
  }
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  request.set_wait_for_capacity(f.wait_for_capacity);
  if (f.dry_run) {
    // Every check a submission gets, and where it would run; nothing is created.
    request.set_dry_run(true);
    StatusOr<v1::SubmitJobResponse> answer = (*client)->SubmitJob(request);
    if (!answer.ok()) return ReportError(answer.status());
    StatusOr<JobSpec> resolved = JobSpecFromProto(*spec);
    if (!resolved.ok()) return ReportError(resolved.status());
    StatusOr<ParallelDims> mesh = MeshOf(*resolved);
    if (!mesh.ok()) return ReportError(mesh.status());
    if (as_json) {
      std::cout << DumpJson(json{{"dry_run", true},
                                 {"spec", JobSpecToJson(*resolved)},
                                 {"mesh", MeshToJson(*mesh)},
                                 {"placement", answer->placement()}})
                << std::endl;
    } else {
      std::cout << "# dry run: the job is valid and nothing was submitted\n"
                << JobSpecToYaml(*resolved) << "# mesh: " << mesh->ToString()
                << "\n# placement: " << EscapeText(answer->placement()) << std::endl;
    }
    return kExitOk;
  }
  request.set_request_id(NewRequestId());
  StatusOr<v1::SubmitJobResponse> submitted = (*client)->SubmitJob(request);
  if (!submitted.ok()) return ReportError(submitted.status());
  const std::string job_id = submitted->job_id();
  if (as_json) {
    std::cout << DumpJson(json{{"job_id", job_id}}) << std::endl;
  } else {
    std::cout << EscapeText(job_id) << std::endl;
  }
  if (!f.follow) return kExitOk;
  // Ctrl-C stops following, not the job: say so, and how to reach it (a one-shot handler; the
  // message is prepared now because the handler may only write(2) and _exit).
  static std::string interrupt_message;
  interrupt_message = "\nstopped following " + job_id +
                      "; it keeps running on the coordinator (hint: meshrun status " + job_id +
                      ", meshrun logs " + job_id + " --follow, meshrun cancel " + job_id + ")\n";
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    ssize_t ignored = write(STDERR_FILENO, interrupt_message.data(), interrupt_message.size());
    (void)ignored;
    _exit(kExitInterrupted);
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // With -o json, stdout carries JSON only: progress goes to stderr, the final status to stdout.
  FollowOptions follow;
  follow.out = as_json ? &std::cerr : &std::cout;
  follow.terminal = !as_json && StdoutIsTerminal();
  follow.show_logs = f.logs;
  StatusOr<FollowResult> followed = FollowJob(**client, job_id, follow);
  if (!followed.ok()) return ReportError(followed.status());
  const v1::Job& job = followed->job;
  if (as_json) {
    std::cout << DumpJson(JobStatusJson(job)) << std::endl;
  } else {
    // The totals `train` ends with (client/progress.h).
    RunTotals totals;
    totals.last_step = job.step();
    totals.steps = job.steps();
    totals.final_loss = job.loss();
    totals.tokens_per_second = followed->tokens_per_second;
    totals.mfu = followed->mfu;
    std::string line = "job " + job.job_id() + " " + JobStateName(job.state()) + " after " +
                       RenderRunTotals(totals) + ", restarts " + std::to_string(job.restarts());
    if (!job.message().empty()) line += ": " + job.message();
    std::cout << EscapeText(line) << std::endl;
  }
  return job.state() == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitFailure;
}

}  // namespace

StatusOr<v1::JobSpec> PrepareSubmission(const std::string& file,
                                        const std::vector<std::string>& overrides,
                                        bool local_checks) {
  // The client's one validation (LoadJobSpecFile validates what it reads).
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpecFile(file, overrides));
  MakeAbsolute(spec.data.train);
  for (DataSource& source : spec.data.train_sources) MakeAbsolute(source.path);
  MakeAbsolute(spec.data.val);
  MakeAbsolute(spec.data.tokenizer);
  MakeAbsolute(spec.checkpoint.dir);
  MakeAbsolute(spec.model.init_from);
  if (local_checks && !spec.parallelism.auto_mesh) {  // auto: checked once the mesh is chosen
    // Data, checkpoint.dir and one rank's memory on this host (preflight.h); the workers check
    // their own memory again when a rank starts.
    MESHRUN_ASSIGN_OR_RETURN(ParallelDims mesh, MeshOf(spec));
    MESHRUN_RETURN_IF_ERROR(CheckBeforeTraining(spec, mesh));
  }
  v1::JobSpec proto = JobSpecToProto(spec);
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  proto.set_source_yaml(text.str());
  for (const std::string& kv : overrides) proto.add_set_overrides(kv);
  return proto;
}

std::string NewRequestId() {
  std::random_device device;
  char text[40];
  std::snprintf(text, sizeof(text), "%08x%08x%08x%08x", device(), device(), device(), device());
  return text;
}

void RegisterSubmitCommand(CLI::App& app, CommandResult& result) {
  auto f = std::make_shared<SubmitFlags>();
  CLI::App* cmd = app.add_subcommand("submit", "Submit a job to the coordinator; print its id");
  cmd->add_option("-f,--file", f->file, "job spec (YAML)")->required();
  cmd->add_option("--set", f->overrides, "override a field: dotted.path=value (repeatable)")
      ->expected(1)
      ->take_all();
  cmd->add_flag("--follow", f->follow, "show the job's progress until it ends");
  cmd->add_flag("--logs", f->logs, "with --follow: also print the ranks' log lines");
  cmd->add_flag("--wait-for-capacity", f->wait_for_capacity,
                "queue the job even when the registered workers together are too few for it");
  cmd->add_flag("--dry-run", f->dry_run,
                "check the spec and ask the coordinator where it would run; submit nothing");
  cmd->add_flag("--skip-local-checks", f->skip_local_checks,
                "do not check data, checkpoint.dir and memory on this host (paths that exist "
                "only on the workers)");
  cmd->add_option("-o,--output", f->output, "output format: text or json")
      ->check(CLI::IsMember({"text", "json"}));
  AddCoordinatorOption(cmd, &f->coordinator);
  cmd->callback([f, &result] { result.run = [f] { return RunSubmit(*f); }; });
}

}  // namespace meshrun::client
