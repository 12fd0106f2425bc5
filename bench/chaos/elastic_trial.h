// Elastic trials on a real local cluster (issue #36, decision 0056): a coordinator and two
// 2-slot workers on loopback run a tiny 4-rank elastic job (dp_shard 2 × tp 2, elastic 2–4 ranks,
// a checkpoint every 4 steps) while one capacity change hits at a seeded step: a worker killed for
// good (the job shrinks to tp 2 on the other worker after wait_seconds), a worker added (the job
// started on 2 ranks grows to 4), or a drain (the job checkpoints now and moves to the other
// worker). Each trial must SUCCEED with the undisturbed run's final loss; it reports the time
// from the fault to the first step on the new mesh and the steps lost. Shared by
// tests/integration/elastic_test.cc and bench/chaos (--faults worker-gone,worker-added,drain).
// No gtest here: results are values, and every wait is bounded.
#pragma once

#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/chaos/chaos_trial.h"
#include "bench/chaos/local_cluster.h"
#include "tests/integration/daemons.h"

namespace meshrun::chaos {

enum class ElasticFault { kWorkerGone, kWorkerAdded, kDrain };

inline const char* ElasticFaultName(ElasticFault f) {
  switch (f) {
    case ElasticFault::kWorkerGone: return "worker-gone";
    case ElasticFault::kWorkerAdded: return "worker-added";
    case ElasticFault::kDrain: return "drain";
  }
  return "?";
}

struct ElasticResult {
  ElasticFault fault = ElasticFault::kWorkerGone;
  uint64_t seed = 0;
  bool ok = false;
  std::string why;
  std::string job_id;
  int fault_at_step = -1;
  int world_before = 0, world_after = 0;
  int64_t resumed_from = -1;  // the new mesh's from_step
  int64_t steps_lost = -1;    // the job's step at the fault's end − resumed_from
  bool step_went_back = false;
  double final_loss = NAN;
  double reference_loss = NAN;
  // Fault → the first step on the new mesh (status polled every 50 ms).
  double recovery_seconds = NAN;
  double trial_seconds = 0;
  std::string status;  // the final `status -o json`
  std::string logs;    // the coordinator's log tail when it failed
  // Moments that came too late and were tried again with another seed (RunTrial): the job had
  // ended, or was too near its end for the change to take effect, when the harness got to the
  // fault (a loaded machine slows the harness's polls, not the job's steps).
  int missed = 0;
  bool too_late = false;
};

class ElasticCluster : public LocalCluster {
 public:
  struct Options {
    fs::path bin_dir;
    fs::path dir;
    std::string corpus = "/usr/share/games/fortunes/cookie";
    int steps = 60;
    int every = 4;
    int wait_seconds = 1;
    int heartbeat_timeout_s = 2;
    int comm_timeout_s = 10;
    std::chrono::seconds trial_timeout{60};
  };

  explicit ElasticCluster(Options o)
      : LocalCluster(o.bin_dir, o.dir, o.heartbeat_timeout_s, "0.2"), o_(std::move(o)) {}

  std::string Spec(const fs::path& checkpoints) const {
    return "name: elastic\n"
           "model: {arch: gpt2, n_layer: 2, n_head: 2, d_model: 64, seq_len: 64, vocab_size: 256}\n"
           "parallelism: {dp_replicate_size: 1, dp_shard_size: 2, cp_size: 1, tp_size: 2, "
           "comm_timeout_seconds: " +
           std::to_string(o_.comm_timeout_s) + "}\ntrain: {steps: " + std::to_string(o_.steps) +
           ", global_batch_size: 8, micro_batch_size: 2, lr: 1.0e-3, min_lr: 1.0e-4, "
           "warmup_steps: 2, seed: 1337}\n"
           "data: {train: " +
           o_.corpus + ", format: text}\ncheckpoint: {dir: " + checkpoints.string() +
           ", every: " + std::to_string(o_.every) +
           ", keep: 2}\nrestart: {max_restarts: 3}\n"
           "resources: {threads: 1, elastic: {min_ranks: 2, max_ranks: 4, wait_seconds: " +
           std::to_string(o_.wait_seconds) + "}}\n";
  }

  // The undisturbed run: the same spec trained standalone on 4 ranks.
  double ReferenceLoss() {
    fs::create_directories(o_.dir);
    const fs::path spec = o_.dir / "reference.yaml";
    std::ofstream(spec) << Spec(o_.dir / "reference-checkpoints");
    return TrainFinalLoss(spec, 4);
  }

  // A coordinator, no workers yet.
  bool Start(std::string* why) { return StartCoordinator(why); }

  // One trial with fresh workers (named after the trial, so a killed one never comes back); a
  // moment that comes too late is tried again with the seed + 1000, then + 2000, and fails the
  // trial the third time.
  ElasticResult RunTrial(ElasticFault fault, uint64_t seed, double reference) {
    return RetryLateMoments<ElasticResult>(
        seed, o_.steps, [&](uint64_t s) { return RunOnce(fault, s, reference); });
  }

  ElasticResult RunOnce(ElasticFault fault, uint64_t seed, double reference) {
    ElasticResult t;
    t.fault = fault;
    t.seed = seed;
    t.reference_loss = reference;
    const auto begin = Clock::now();
    const auto give_up = begin + o_.trial_timeout;
    std::mt19937_64 rng(seed);
    // A worker added late would find the job done before it registers: the first quarter.
    const int last = fault == ElasticFault::kWorkerAdded ? o_.steps / 8 : o_.steps / 2;
    const int target = std::uniform_int_distribution<int>(2, std::max(2, last))(rng);
    const int delay_ms = std::uniform_int_distribution<int>(0, 300)(rng);
    const std::string n = std::to_string(++trials_);
    const std::string a = "t" + n + "a", b = "t" + n + "b";
    auto fail = [&](const std::string& why) {
      t.ok = false;
      t.why = why;
      t.status = Status(t.job_id).dump();
      const std::string log = ReadFile(o_.dir / "coordinator.log");
      t.logs = log.substr(log.size() > 6000 ? log.size() - 6000 : 0);
      t.trial_seconds = std::chrono::duration<double>(Clock::now() - begin).count();
      StopWorkers();
      return t;
    };
    StartWorker(a, 2);
    if (fault != ElasticFault::kWorkerAdded) StartWorker(b, 2);
    if (!WaitReady(fault == ElasticFault::kWorkerAdded ? std::vector<std::string>{a}
                                                       : std::vector<std::string>{a, b},
                   30s)) {
      return fail("the workers did not become READY");
    }
    const fs::path checkpoints = o_.dir / ("trial-" + n + "-checkpoints");
    const fs::path spec = o_.dir / ("trial-" + n + ".yaml");
    std::ofstream(spec) << Spec(checkpoints);
    const CliResult submitted = Cli({"submit", "-f", spec.string(), "-o", "json"});
    if (submitted.exit_code != 0)
      return fail("submit exited " + std::to_string(submitted.exit_code));
    t.job_id = json::parse(submitted.out, nullptr, false).value("job_id", "");
    if (t.job_id.empty()) return fail("no job id");

    json s;
    int last_step = 0;
    auto poll = [&]() {
      s = Status(t.job_id);
      if (!s.is_object()) return false;
      const int step = s["step"].get<int>();
      if (step < last_step) t.step_went_back = true;
      last_step = std::max(last_step, step);
      return true;
    };
    while (Clock::now() < give_up) {
      if (poll() && s["state"] == "RUNNING" && s["step"].get<int>() >= target) break;
      std::this_thread::sleep_for(50ms);
    }
    // Too late (the job ended, or is too near its end for the change to take effect): the job
    // ends untouched, and RunTrial tries another seed.
    const int latest = fault == ElasticFault::kWorkerAdded ? o_.steps / 2 : o_.steps - 2 * o_.every;
    auto too_late = [&]() {
      t.too_late = true;
      if (s.is_object()) t.fault_at_step = s["step"].get<int>();
      while (Clock::now() < give_up) {
        if (poll() && (s["state"] == "SUCCEEDED" || s["state"] == "FAILED")) break;
        std::this_thread::sleep_for(100ms);
      }
      t.trial_seconds = std::chrono::duration<double>(Clock::now() - begin).count();
      StopWorkers();
      return t;
    };
    if (s.is_object() && s["state"] == "SUCCEEDED") return too_late();
    if (!s.is_object() || s["state"] != "RUNNING") return fail("never RUNNING at the target step");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    poll();
    if (s.is_object() &&
        (s["state"] == "SUCCEEDED" || (s["state"] == "RUNNING" && s["step"].get<int>() > latest))) {
      return too_late();
    }
    t.fault_at_step = s["step"].get<int>();
    t.world_before = s["world_size"].get<int>();
    const size_t meshes_before = s.contains("meshes") ? s["meshes"].size() : 0;
    const auto fault_time = Clock::now();
    switch (fault) {
      case ElasticFault::kWorkerGone:
        for (testing::Daemon& w : workers_) {
          if (w.name == b) testing::KillNow(w);
        }
        break;
      case ElasticFault::kWorkerAdded: StartWorker(b, 2); break;
      case ElasticFault::kDrain:
        if (Cli({"workers", "drain", b}).exit_code != 0) return fail("workers drain failed");
        break;
    }
    // The first step on the new mesh: a new meshes entry whose attempt runs past its from_step.
    while (Clock::now() < give_up) {
      if (poll() && s.contains("meshes") && s["meshes"].size() > meshes_before) {
        const json& m = s["meshes"].back();
        const bool on_it = s["attempt"].get<int>() >= m["attempt"].get<int>();
        const int64_t from = m["from_step"].get<int64_t>();
        if (on_it && s["state"] == "SUCCEEDED") break;
        if (on_it && s["state"] == "RUNNING" && from >= 0 && s["step"].get<int64_t>() > from) {
          t.recovery_seconds = std::chrono::duration<double>(Clock::now() - fault_time).count();
          break;
        }
      }
      if (s.is_object() && (s["state"] == "FAILED" || s["state"] == "SUCCEEDED")) break;
      std::this_thread::sleep_for(50ms);
    }
    while (Clock::now() < give_up) {
      if (poll() && (s["state"] == "SUCCEEDED" || s["state"] == "FAILED")) break;
      std::this_thread::sleep_for(100ms);
    }
    if (!s.is_object() || s["state"] != "SUCCEEDED") {
      return fail("did not SUCCEED within " + std::to_string(o_.trial_timeout.count()) + " s");
    }
    t.final_loss = s["loss"].get<double>();
    t.world_after = s["world_size"].get<int>();
    if (s.contains("meshes") && s["meshes"].size() > meshes_before) {
      const json& m = s["meshes"][meshes_before];
      t.resumed_from = m["from_step"].get<int64_t>();
      t.steps_lost = m["steps_lost"].get<int64_t>();
    }
    t.status = s.dump();
    t.trial_seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    StopWorkers();
    t.ok = true;
    Check(&t);
    if (!t.ok) {
      const std::string log = ReadFile(o_.dir / "coordinator.log");
      t.logs = log.substr(log.size() > 6000 ? log.size() - 6000 : 0);
    }
    return t;
  }

 private:
  void Check(ElasticResult* t) const {
    auto claim = [&](bool holds, const std::string& what) {
      if (!holds && t->ok) {
        t->ok = false;
        t->why = what;
      }
    };
    claim(std::abs(t->final_loss - t->reference_loss) <= 1e-5 * std::abs(t->reference_loss),
          "final loss " + std::to_string(t->final_loss) + " != the undisturbed " +
              std::to_string(t->reference_loss));
    const int expected_before = t->fault == ElasticFault::kWorkerAdded ? 2 : 4;
    const int expected_after = t->fault == ElasticFault::kWorkerAdded ? 4 : 2;
    claim(t->world_before == expected_before, "world size " + std::to_string(t->world_before) +
                                                  " before the fault, expected " +
                                                  std::to_string(expected_before));
    claim(t->world_after == expected_after, "world size " + std::to_string(t->world_after) +
                                                " at the end, expected " +
                                                std::to_string(expected_after));
    claim(t->resumed_from >= 0, "the new mesh resumed from no checkpoint");
    if (t->fault != ElasticFault::kWorkerGone) {
      // Checkpoint now: nothing is done again, and the step never goes back.
      claim(t->steps_lost == 0, "steps lost " + std::to_string(t->steps_lost) + ", expected 0");
      claim(!t->step_went_back, "the job's step went back");
    }
  }

  // Stops the trial's workers and waits (bounded) until the coordinator has them LOST, so the
  // next trial's job is never placed on a stopped worker whose lease still runs.
  void StopWorkers() {
    for (testing::Daemon& w : workers_) testing::Stop(w, 5s);
    workers_.clear();
    const auto give_up = Clock::now() + 20s;
    while (Clock::now() < give_up) {
      json list = json::parse(Cli({"workers", "-o", "json"}).out, nullptr, false);
      bool live = false;
      if (list.is_array()) {
        for (const json& w : list) live = live || w["state"] != "LOST";
      }
      if (!live) return;
      std::this_thread::sleep_for(100ms);
    }
  }

  bool WaitReady(const std::vector<std::string>& names, std::chrono::seconds timeout) const {
    const auto give_up = Clock::now() + timeout;
    while (Clock::now() < give_up) {
      const CliResult r = Cli({"workers", "-o", "json"});
      json list = json::parse(r.out, nullptr, false);
      size_t ready = 0;
      if (list.is_array()) {
        for (const json& w : list) {
          ready += w["state"] == "READY" && std::find(names.begin(), names.end(),
                                                      w["name"].get<std::string>()) != names.end();
        }
      }
      if (ready >= names.size()) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  Options o_;
  int trials_ = 0;
};

}  // namespace meshrun::chaos
