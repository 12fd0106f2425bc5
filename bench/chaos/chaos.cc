// bench/chaos: N seeded chaos trials on a local cluster (bench/chaos/chaos_trial.h): faults in
// turn kill-rank, kill-coordinator, kill-worker, stop-rank, kill-rank-in-restart (or --faults,
// which also knows sigterm-coordinator and sigterm-coordinator-at-barrier),
// one per trial; --faults worker-gone,worker-added,drain runs the elastic trials instead
// (bench/chaos/elastic_trial.h: a 4-rank elastic job on two 2-slot workers). Prints
// a row per trial, a summary table (per fault: trials, succeeded with the undisturbed loss,
// recovery p50/p95) and one JSON line. Exit 0 only when every trial held.
//   build/bin/chaos --trials 50 --seed 1
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "bench/chaos/chaos_trial.h"
#include "bench/chaos/elastic_trial.h"

namespace {

using meshrun::chaos::ChaosCluster;
using meshrun::chaos::Fault;
using meshrun::chaos::TrialResult;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

// The elastic faults (bench/chaos/elastic_trial.h): per fault the time from the fault to the
// first step on the new mesh (p50/p95) and the steps lost.
int RunElastic(const std::vector<meshrun::chaos::ElasticFault>& faults, int trials, uint64_t seed,
               const std::string& bin_dir, std::string dir) {
  using meshrun::chaos::ElasticCluster;
  using meshrun::chaos::ElasticResult;
  const bool own_dir = dir.empty();
  if (own_dir) {
    char pattern[] = "/tmp/meshrun_bench_elastic_XXXXXX";
    if (mkdtemp(pattern) == nullptr) return 1;
    dir = pattern;
  }
  ElasticCluster::Options options;
  options.bin_dir = bin_dir;
  options.dir = dir;
  ElasticCluster cluster(options);
  const double reference = cluster.ReferenceLoss();
  std::string why;
  if (std::isnan(reference) || !cluster.Start(&why)) {
    std::fprintf(stderr, "error: the undisturbed run or the coordinator failed (logs in %s)\n",
                 dir.c_str());
    return 1;
  }
  std::printf("undisturbed final loss %.6f; %d elastic trials from seed %llu\n", reference, trials,
              static_cast<unsigned long long>(seed));
  std::printf("%5s %-13s %5s %6s %6s %7s %10s %8s %10s %8s %s\n", "trial", "fault", "seed", "step",
              "world", "resumed", "steps_lost", "loss_ok", "to_step_s", "trial_s", "result");
  std::map<std::string, std::vector<ElasticResult>> by_fault;
  int held = 0;
  for (int i = 0; i < trials; ++i) {
    const auto fault = faults[static_cast<size_t>(i) % faults.size()];
    const ElasticResult t = cluster.RunTrial(fault, seed + static_cast<uint64_t>(i), reference);
    const bool loss_ok = std::abs(t.final_loss - reference) <= 1e-5 * std::abs(reference);
    const std::string world = std::to_string(t.world_before) + ">" + std::to_string(t.world_after);
    std::printf("%5d %-13s %5llu %6d %6s %7lld %10lld %8s %10.1f %8.1f %s\n", i + 1,
                meshrun::chaos::ElasticFaultName(fault),
                static_cast<unsigned long long>(seed + static_cast<uint64_t>(i)), t.fault_at_step,
                world.c_str(), static_cast<long long>(t.resumed_from),
                static_cast<long long>(t.steps_lost), loss_ok ? "yes" : "no", t.recovery_seconds,
                t.trial_seconds, t.ok ? "ok" : ("FAIL: " + t.why).c_str());
    std::fflush(stdout);
    held += t.ok;
    by_fault[meshrun::chaos::ElasticFaultName(fault)].push_back(t);
  }
  std::printf("\n%-13s %6s %6s %20s %20s %16s\n", "fault", "trials", "held", "fault_to_step_p50_s",
              "fault_to_step_p95_s", "steps_lost_mean");
  meshrun::chaos::json per_fault = meshrun::chaos::json::object();
  for (const auto& [name, results] : by_fault) {
    std::vector<double> rec;
    double lost = 0;
    int ok = 0;
    for (const ElasticResult& t : results) {
      ok += t.ok;
      if (t.ok) {
        rec.push_back(t.recovery_seconds);
        lost += static_cast<double>(std::max<int64_t>(0, t.steps_lost));
      }
    }
    const double lost_mean = ok > 0 ? lost / ok : NAN;
    std::printf("%-13s %6zu %6d %20.1f %20.1f %16.2f\n", name.c_str(), results.size(), ok,
                Percentile(rec, 0.5), Percentile(rec, 0.95), lost_mean);
    per_fault[name] = {{"trials", results.size()},
                       {"held", ok},
                       {"fault_to_first_step_p50_s", Percentile(rec, 0.5)},
                       {"fault_to_first_step_p95_s", Percentile(rec, 0.95)},
                       {"steps_lost_mean", lost_mean}};
  }
  meshrun::chaos::json line = {
      {"bench", "chaos-elastic"},      {"trials", trials},   {"held", held}, {"seed", seed},
      {"undisturbed_loss", reference}, {"faults", per_fault}};
  std::printf("%s\n", line.dump().c_str());
  cluster.Stop();
  if (held == trials && own_dir) std::filesystem::remove_all(dir);
  if (held != trials) std::fprintf(stderr, "logs kept in %s\n", dir.c_str());
  return held == trials ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 50;
  uint64_t seed = 1;
  std::vector<std::string> fault_names = {"kill-rank", "kill-coordinator", "kill-worker",
                                          "stop-rank", "kill-rank-in-restart"};
  std::string bin_dir = "build/bin";
  std::string dir;
  int steps = 40;
  CLI::App app{"chaos: seeded faults against a local meshrun cluster"};
  app.add_option("--trials", trials, "number of trials")->capture_default_str();
  app.add_option("--seed", seed, "seed of the first trial (trial i uses seed + i)")
      ->capture_default_str();
  app.add_option("--faults", fault_names, "faults, used in turn")->delimiter(',');
  app.add_option("--bin-dir", bin_dir, "folder of meshrun, meshrun-worker, meshrun-coordinator")
      ->capture_default_str();
  app.add_option("--dir", dir,
                 "work folder (default: a fresh one under /tmp, removed if all held)");
  app.add_option("--steps", steps, "steps of the job")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<meshrun::chaos::ElasticFault> elastic;
  for (const std::string& f : fault_names) {
    for (auto k :
         {meshrun::chaos::ElasticFault::kWorkerGone, meshrun::chaos::ElasticFault::kWorkerAdded,
          meshrun::chaos::ElasticFault::kDrain}) {
      if (f == meshrun::chaos::ElasticFaultName(k)) elastic.push_back(k);
    }
  }
  if (!elastic.empty()) {
    if (elastic.size() != fault_names.size()) {
      std::fprintf(stderr,
                   "error: --faults: the elastic faults (worker-gone, worker-added, drain) run "
                   "on their own cluster (hint: give them without the others)\n");
      return 2;
    }
    return RunElastic(elastic, trials, seed, bin_dir, dir);
  }
  std::vector<Fault> faults;
  for (const std::string& f : fault_names) {
    bool known = false;
    for (Fault k :
         {Fault::kKillRank, Fault::kKillWorker, Fault::kKillCoordinator, Fault::kStopRank,
          Fault::kKillRankInRestart, Fault::kTermCoordinator, Fault::kTermCoordinatorAtBarrier}) {
      if (f == meshrun::chaos::FaultName(k)) {
        faults.push_back(k);
        known = true;
      }
    }
    if (!known) {
      std::fprintf(stderr,
                   "error: --faults: unknown fault '%s' (hint: kill-rank, kill-worker, "
                   "kill-coordinator, stop-rank, kill-rank-in-restart, sigterm-coordinator, "
                   "sigterm-coordinator-at-barrier; or the elastic worker-gone, worker-added, "
                   "drain)\n",
                   f.c_str());
      return 2;
    }
  }
  const bool own_dir = dir.empty();
  if (own_dir) {
    char pattern[] = "/tmp/meshrun_bench_chaos_XXXXXX";
    if (mkdtemp(pattern) == nullptr) return 1;
    dir = pattern;
  }
  ChaosCluster::Options options;
  options.bin_dir = bin_dir;
  options.dir = dir;
  options.steps = steps;
  ChaosCluster cluster(options);
  const double reference = cluster.ReferenceLoss();
  if (std::isnan(reference)) {
    std::fprintf(stderr, "error: the undisturbed run failed (logs in %s)\n", dir.c_str());
    return 1;
  }
  std::string why;
  if (!cluster.Start(&why)) {
    std::fprintf(stderr, "error: %s (logs in %s)\n", why.c_str(), dir.c_str());
    return 1;
  }
  std::printf("undisturbed final loss %.6f; %d trials from seed %llu\n", reference, trials,
              static_cast<unsigned long long>(seed));
  std::printf("%5s %-16s %5s %6s %5s %7s %7s %7s %8s %10s %8s %s\n", "trial", "fault", "seed",
              "step", "rank", "newest", "resumed", "restarts", "loss_ok", "recovery_s", "trial_s",
              "result");
  std::map<std::string, std::vector<TrialResult>> by_fault;
  std::vector<double> all_recovery;
  int held = 0;
  for (int i = 0; i < trials; ++i) {
    const Fault fault = faults[static_cast<size_t>(i) % faults.size()];
    const TrialResult t = cluster.RunTrial(fault, seed + static_cast<uint64_t>(i), reference);
    const bool loss_ok = std::abs(t.final_loss - reference) <= 1e-5 * std::abs(reference);
    std::printf("%5d %-16s %5llu %6d %5d %7d %7d %8d %8s %10.1f %8.1f %s\n", i + 1,
                meshrun::chaos::FaultName(fault),
                static_cast<unsigned long long>(seed + static_cast<uint64_t>(i)), t.fault_at_step,
                t.victim_rank, t.newest_at_restart, t.resumed_step, t.restarts,
                loss_ok ? "yes" : "no", t.recovery_seconds, t.trial_seconds,
                t.ok ? "ok" : ("FAIL: " + t.why).c_str());
    std::fflush(stdout);
    held += t.ok;
    by_fault[meshrun::chaos::FaultName(fault)].push_back(t);
    if (t.ok) all_recovery.push_back(t.recovery_seconds);
  }
  std::printf("\n%-16s %6s %6s %14s %14s\n", "fault", "trials", "held", "recovery_p50_s",
              "recovery_p95_s");
  meshrun::chaos::json per_fault = meshrun::chaos::json::object();
  for (const auto& [name, results] : by_fault) {
    std::vector<double> rec;
    int ok = 0;
    for (const TrialResult& t : results) {
      ok += t.ok;
      if (t.ok) rec.push_back(t.recovery_seconds);
    }
    std::printf("%-16s %6zu %6d %14.1f %14.1f\n", name.c_str(), results.size(), ok,
                Percentile(rec, 0.5), Percentile(rec, 0.95));
    per_fault[name] = {{"trials", results.size()},
                       {"held", ok},
                       {"recovery_p50_s", Percentile(rec, 0.5)},
                       {"recovery_p95_s", Percentile(rec, 0.95)}};
  }
  std::printf("%-16s %6d %6d %14.1f %14.1f\n", "all", trials, held, Percentile(all_recovery, 0.5),
              Percentile(all_recovery, 0.95));
  meshrun::chaos::json line = {{"bench", "chaos"},
                               {"trials", trials},
                               {"held", held},
                               {"seed", seed},
                               {"undisturbed_loss", reference},
                               {"recovery_p50_s", Percentile(all_recovery, 0.5)},
                               {"recovery_p95_s", Percentile(all_recovery, 0.95)},
                               {"faults", per_fault}};
  std::printf("%s\n", line.dump().c_str());
  cluster.Stop();
  if (held == trials && own_dir) std::filesystem::remove_all(dir);
  if (held != trials) std::fprintf(stderr, "logs kept in %s\n", dir.c_str());
  return held == trials ? 0 : 1;
}
