// Chaos trials on a real local cluster (issue #16): a coordinator and three 1-slot workers on
// loopback run a tiny 2-rank job (dp_shard 2, a checkpoint every 4 steps) while one fault hits at
// a seeded random moment: kill -9 of a rank, of a worker or of the coordinator, or SIGSTOP of a
// rank (a hang). Each trial must end SUCCEEDED with the undisturbed run's final loss, resumed from
// the newest complete checkpoint (or, for a coordinator kill, not restarted at all), within a
// bound. Shared by tests/integration/chaos_test.cc (a few trials in CI) and bench/chaos (many).
// No gtest here: results are values, and every wait is bounded.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/chaos/local_cluster.h"
#include "tests/integration/daemons.h"

namespace meshrun::chaos {

// kKillRankInRestart: kill -9 of a rank, then of a rank of the restarted attempt as soon as it
// runs (during its start: loading the checkpoint, the rendezvous), so the job restarts twice.
// kTermCoordinator: SIGTERM of the coordinator (a clean stop) at the seeded moment, then a new
// one; kTermCoordinatorAtBarrier: the same while both ranks are inside a checkpoint's barrier
// (the coordinator is SIGSTOPped before the checkpoint begins, which holds the barrier open while
// the ranks write their shards and make their store calls; then it gets SIGTERM and SIGCONT).
// Both must look like a kill -9 to the job: the attempt goes on, and `submit --follow`
// reconnects and exits 0.
enum class Fault {
  kKillRank,
  kKillWorker,
  kKillCoordinator,
  kStopRank,
  kKillRankInRestart,
  kTermCoordinator,
  kTermCoordinatorAtBarrier
};

// A fault that stops the coordinator (the job's attempt must simply go on).
inline bool HitsCoordinator(Fault f) {
  return f == Fault::kKillCoordinator || f == Fault::kTermCoordinator ||
         f == Fault::kTermCoordinatorAtBarrier;
}

inline const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kKillRank: return "kill-rank";
    case Fault::kKillWorker: return "kill-worker";
    case Fault::kKillCoordinator: return "kill-coordinator";
    case Fault::kStopRank: return "stop-rank";
    case Fault::kKillRankInRestart: return "kill-rank-in-restart";
    case Fault::kTermCoordinator: return "sigterm-coordinator";
    case Fault::kTermCoordinatorAtBarrier: return "sigterm-coordinator-at-barrier";
  }
  return "?";
}

// A trial whose fault moment came too late (Result::too_late: the job ended or was too near its
// end when a slowed harness got there) is run again with the seed + 1000, then + 2000; the
// third such moment fails the trial. `once(seed)` runs one; Result has ok, why, missed,
// too_late and fault_at_step.
template <typename Result, typename Once>
Result RetryLateMoments(uint64_t seed, int steps, Once once) {
  for (int missed = 0;; ++missed) {
    Result t = once(seed + 1000 * static_cast<uint64_t>(missed));
    t.missed = missed;
    if (!t.too_late) return t;
    if (missed == 2) {
      t.ok = false;
      t.why =
          "three moments in a row came too late: the job ended, was too near its end, or "
          "passed every checkpoint barrier before the fault (last at step " +
          std::to_string(t.fault_at_step) + " of " + std::to_string(steps) + ")";
      return t;
    }
  }
}

struct TrialResult {
  Fault fault = Fault::kKillRank;
  uint64_t seed = 0;
  bool ok = false;
  std::string why;  // what failed, when !ok
  std::string job_id;
  int fault_at_step = -1;  // the job's step when the fault hit
  int fault_delay_ms = 0;  // how long after reaching that step
  int victim_rank = -1;
  int newest_complete = -1;    // newest complete checkpoint step when the fault hit
  int newest_at_restart = -1;  // … when the next attempt was placed
  int resumed_step = -1;       // what the restarted ranks resumed from (-1: no resume)
  int restarts = -1;
  double final_loss = NAN;
  double reference_loss = NAN;
  // Fault → the job's step past where it was, by the next attempt (by the same one after a
  // coordinator kill), or the job's end, whichever is first; seen by polling every 50 ms.
  double recovery_seconds = NAN;
  double trial_seconds = 0;
  int follow_exit = -1;     // exit code of `submit --follow` (-1: did not exit in time)
  bool at_barrier = false;  // sigterm-coordinator-at-barrier: the stop hit a barrier
  std::string transcript;   // `submit --follow` output: states, reasons, rank failures
  std::string logs;         // `meshrun logs JOB`: every rank's lines, "[rank R attempt A] …"
  // Moments that came too late and were tried again with another seed (RunTrial): the job had
  // ended, or was within two checkpoint intervals of its end, when the harness got to the fault,
  // or (sigterm-coordinator-at-barrier) no checkpoint's barrier was caught before the job's end
  // (a loaded machine slows the harness's polls, not the job's steps).
  int missed = 0;
  bool too_late = false;  // this run's moment came too late; nothing was done to the job
};

// The cluster and the job of every trial. Not thread-safe; one trial at a time.
class ChaosCluster : public LocalCluster {
 public:
  struct Options {
    fs::path bin_dir;  // holds meshrun, meshrun-worker, meshrun-coordinator
    fs::path dir;      // a fresh folder for state, work dirs, logs and checkpoints
    std::string corpus = "/usr/share/games/fortunes/cookie";
    int steps = 40;
    int every = 4;
    int max_restarts = 3;
    int heartbeat_timeout_s = 3;
    // parallelism.comm_timeout_seconds: what finds a hung rank, in a collective or in a
    // checkpoint's barrier (a store wait with the same bound). The test uses 10 s; bench/chaos 30.
    int comm_timeout_s = 30;
    // The stated bound per trial; a stop-rank trial also waits out the comm timeout.
    std::chrono::seconds trial_timeout{150};
    std::chrono::seconds hang_trial_timeout{240};
  };

  explicit ChaosCluster(Options o)
      : LocalCluster(o.bin_dir, o.dir, o.heartbeat_timeout_s, "0.5"), o_(std::move(o)) {}

  std::string Spec(const fs::path& checkpoints) const {
    return "name: chaos\n"
           "model: {arch: gpt2, n_layer: 2, n_head: 2, d_model: 64, seq_len: 64, vocab_size: "
           "256}\n"
           "parallelism: {dp_replicate_size: 1, dp_shard_size: 2, cp_size: 1, tp_size: 1, "
           "comm_timeout_seconds: " +
           std::to_string(o_.comm_timeout_s) +
           "}\n"
           "train: {steps: " +
           std::to_string(o_.steps) +
           ", global_batch_size: 8, micro_batch_size: 2, lr: 1.0e-3, min_lr: 1.0e-4, "
           "warmup_steps: 2, seed: 1337}\n"
           "data: {train: " +
           o_.corpus +
           ", format: text}\n"
           "checkpoint: {dir: " +
           checkpoints.string() + ", every: " + std::to_string(o_.every) +
           ", keep: 2}\n"
           "restart: {max_restarts: " +
           std::to_string(o_.max_restarts) + "}\n";
  }

  // The undisturbed run: the same spec trained standalone (`meshrun train --nproc 2`).
  double ReferenceLoss() {
    const fs::path spec = o_.dir / "reference.yaml";
    std::ofstream(spec) << Spec(o_.dir / "reference-checkpoints");
    return TrainFinalLoss(spec, 2);
  }

  // Coordinator + workers w1..w3, READY. False (with `why`) when they do not come up in time.
  bool Start(std::string* why) {
    if (!StartCoordinator(why)) return false;
    for (const char* name : {"w1", "w2", "w3"}) StartWorker(name, 1);
    if (!WaitWorkers(3, 30s)) {
      *why = "the 3 workers did not become READY: " + Cli({"workers"}).out;
      return false;
    }
    return true;
  }

  // One trial; a moment that comes too late (see TrialResult::missed) is tried again with the
  // seed + 1000, then + 2000, and fails the trial the third time.
  TrialResult RunTrial(Fault fault, uint64_t seed, double reference) {
    return RetryLateMoments<TrialResult>(seed, o_.steps,
                                         [&](uint64_t s) { return RunOnce(fault, s, reference); });
  }

  TrialResult RunOnce(Fault fault, uint64_t seed, double reference) {
    TrialResult t;
    t.fault = fault;
    t.seed = seed;
    t.reference_loss = reference;
    const Clock::time_point begin = Clock::now();
    const std::chrono::seconds bound =
        fault == Fault::kStopRank ? o_.hang_trial_timeout : o_.trial_timeout;
    const Clock::time_point give_up = begin + bound;
    std::mt19937_64 rng(seed);
    // When: a step in [1, steps / 2] (half the run is left after the fault, far more than the
    // delay) plus 0–400 ms, which lands anywhere in a step: forward, a collective, a checkpoint
    // write, the barrier before metadata.json.
    const int target = std::uniform_int_distribution<int>(1, o_.steps / 2)(rng);
    t.fault_delay_ms = std::uniform_int_distribution<int>(0, 400)(rng);
    const int victim_index = std::uniform_int_distribution<int>(0, 1)(rng);

    const std::string name = "trial-" + std::to_string(++trials_);
    const fs::path checkpoints = o_.dir / (name + "-checkpoints");
    const fs::path spec = o_.dir / (name + ".yaml");
    std::ofstream(spec) << Spec(checkpoints);
    const fs::path follow_log = o_.dir / (name + "-follow.log");
    testing::Daemon follow = testing::Spawn("follow",
                                            {(o_.bin_dir / "meshrun").string(), "submit", "-f",
                                             spec.string(), "--follow", "--coordinator", address_},
                                            follow_log);
    auto fail = [&](const std::string& why) {
      t.ok = false;
      t.why = why;
      if (!t.job_id.empty()) t.logs = Cli({"logs", t.job_id}).out;
      t.trial_seconds = std::chrono::duration<double>(Clock::now() - begin).count();
      t.transcript = ReadFile(follow_log);
      testing::Stop(follow, 2s);
      CleanUpStopped();
      return t;
    };
    // A moment that came too late (the job near its end, or no barrier caught): the job ends
    // untouched and the trial is reported so (RunTrial tries another seed).
    auto too_late = [&]() {
      t.too_late = true;
      json end;
      WaitStatus(
          t.job_id,
          [](const json& j) { return j["state"] == "SUCCEEDED" || j["state"] == "FAILED"; },
          give_up, &end);
      t.follow_exit = WaitExitCode(follow.pid, 20s);
      if (t.follow_exit == -1) testing::Stop(follow, 2s);
      follow.pid = -1;
      t.trial_seconds = std::chrono::duration<double>(Clock::now() - begin).count();
      return t;
    };
    // The job id is the follower's first line.
    while (t.job_id.empty() && Clock::now() < give_up) {
      const std::vector<std::string> lines = Lines(ReadFile(follow_log));
      if (!lines.empty() && lines[0].rfind("job-", 0) == 0) t.job_id = lines[0];
      std::this_thread::sleep_for(20ms);
    }
    if (t.job_id.empty()) return fail("no job id from submit --follow");
    json s;
    // A barrier fault's moment is a checkpoint's barrier, not a step plus a delay (steps of a few
    // ms would carry the job past its last checkpoint during the delay): it is armed as soon as
    // the job runs, for the first checkpoint at or after `target`, and at least the second (the
    // stop must never fall in the ranks' start, whose rendezvous is in the coordinator's store).
    const bool at_barrier = fault == Fault::kTermCoordinatorAtBarrier;
    const int barrier = std::max(2 * o_.every, (target + o_.every - 1) / o_.every * o_.every);
    if (!WaitStatus(
            t.job_id,
            [&](const json& j) {
              return at_barrier
                         ? j["state"] == "RUNNING" && j.contains("ranks") && j["ranks"].size() > 1
                         : j["step"].get<int>() >= target;
            },
            give_up, &s)) {
      return fail("never reached step " + std::to_string(target) + ": " + s.dump());
    }
    if (!at_barrier) std::this_thread::sleep_for(std::chrono::milliseconds(t.fault_delay_ms));
    s = Status(t.job_id);
    if (!at_barrier && s.is_object() &&
        (s["state"] == "SUCCEEDED" ||
         (s["state"] == "RUNNING" && s["step"].get<int>() > o_.steps - 2 * o_.every))) {
      t.fault_at_step = s["step"].get<int>();
      return too_late();
    }
    if (!s.is_object() || s["state"] != "RUNNING") return fail("not RUNNING at the fault");
    t.fault_at_step = s["step"].get<int>();
    const json& victim = s["ranks"][victim_index];
    t.victim_rank = victim["rank"].get<int>();
    const pid_t pid = victim["pid"].get<int>();
    const std::string worker = victim["worker"].get<std::string>();
    if (pid <= 0 && !at_barrier) return fail("no pid for rank " + std::to_string(t.victim_rank));

    // The fault.
    Clock::time_point fault_time = Clock::now();
    switch (fault) {
      case Fault::kKillRank:
      case Fault::kKillRankInRestart: kill(pid, SIGKILL); break;
      case Fault::kStopRank:
        kill(pid, SIGSTOP);
        stopped_.push_back(pid);
        break;
      case Fault::kKillWorker:
        for (testing::Daemon& w : workers_) {
          if (w.name == worker) testing::KillNow(w);
        }
        break;
      case Fault::kKillCoordinator: testing::KillNow(coordinator_); break;
      case Fault::kTermCoordinator:
        if (!TermCoordinator()) return fail("the coordinator did not exit within 20 s of SIGTERM");
        break;
      case Fault::kTermCoordinatorAtBarrier:
        const int term =
            TermCoordinatorAtBarrier(checkpoints, barrier, give_up, &t.fault_at_step, &fault_time);
        if (term < 0 && coordinator_.pid > 0) return too_late();
        if (term <= 0) {
          return fail("no checkpoint barrier from step " + std::to_string(barrier) +
                      " on to stop the coordinator in, or it did not exit");
        }
        t.at_barrier = true;
        break;
    }
    t.newest_complete = NewestComplete(checkpoints);
    if (HitsCoordinator(fault)) {
      std::string why;
      if (!StartCoordinator(&why)) return fail(why);
    }
    // The attempt the job should finish on, and the newest complete checkpoint each time a
    // new attempt is seen placed (the last one is what the finishing attempt resumed from).
    const int final_attempt = HitsCoordinator(fault)               ? 1
                              : fault == Fault::kKillRankInRestart ? 3
                                                                   : 2;
    int attempt_seen = 1;
    auto note_attempt = [&](const json& j) {
      if (!j.is_object() || j["attempt"].get<int>() <= attempt_seen) return;
      attempt_seen = j["attempt"].get<int>();
      t.newest_at_restart = NewestComplete(checkpoints);
    };
    if (fault == Fault::kKillRankInRestart) {
      // The second kill: a rank of attempt 2 as soon as its process exists.
      pid_t second = 0;
      while (second <= 0 && Clock::now() < give_up) {
        s = Status(t.job_id);
        note_attempt(s);
        if (s.is_object() && s["attempt"].get<int>() >= 2 && s["ranks"].size() > 1) {
          second = s["ranks"][1 - victim_index]["pid"].get<int>();
        }
        if (second <= 0) std::this_thread::sleep_for(20ms);
      }
      if (second <= 0) return fail("attempt 2 never started its ranks: " + s.dump());
      kill(second, SIGKILL);
    }
    // Recovery: the job's step goes past where it was, or the job ends.
    while (Clock::now() < give_up) {
      s = Status(t.job_id);
      if (s.is_object()) {
        note_attempt(s);
        // Progress past the fault: by the same attempt after a coordinator kill, else by the
        // next one (a stopped rank may have reported a step beyond the job's before it hung).
        const bool ended = s["state"] == "SUCCEEDED" || s["state"] == "FAILED";
        const bool next = s["attempt"].get<int>() >= final_attempt;
        if (ended || (next && s["step"].get<int>() > t.fault_at_step && s["state"] == "RUNNING")) {
          t.recovery_seconds = std::chrono::duration<double>(Clock::now() - fault_time).count();
          break;
        }
      }
      std::this_thread::sleep_for(50ms);
    }
    if (std::isnan(t.recovery_seconds)) return fail("no progress after the fault: " + s.dump());
    // The end.
    while (Clock::now() < give_up) {
      s = Status(t.job_id);
      note_attempt(s);
      if (s.is_object() && (s["state"] == "SUCCEEDED" || s["state"] == "FAILED")) break;
      std::this_thread::sleep_for(100ms);
    }
    // A killed worker comes back under its name for the next trial.
    if (fault == Fault::kKillWorker) StartWorker(worker, 1);
    if (!s.is_object() || s["state"] != "SUCCEEDED") {
      return fail("did not SUCCEED within " + std::to_string(bound.count()) + " s: " + s.dump());
    }
    t.restarts = s["restarts"].get<int>();
    t.final_loss = s["loss"].get<double>();
    // What the restarted ranks say they resumed from (rank 0's log: "resumed from DIR at step N").
    CliResult logs = Cli({"logs", t.job_id, "--rank", "0"});
    for (const std::string& line : Lines(logs.out)) {
      const size_t at = line.find("resumed from ");
      const size_t step = line.find(" at step ", at);
      if (at != std::string::npos && step != std::string::npos) {
        t.resumed_step = std::atoi(line.c_str() + step + 9);
      }
    }
    t.follow_exit = WaitExitCode(follow.pid, 20s);
    if (t.follow_exit == -1) testing::Stop(follow, 2s);
    follow.pid = -1;
    if (fault == Fault::kStopRank) {
      // The job has moved on; the stopped rank goes when its stop order's grace (10 s) is out,
      // and its worker then says why it had to be killed. Bounded wait for that.
      const Clock::time_point until = Clock::now() + 20s;
      while (testing::Alive(pid) && Clock::now() < until) std::this_thread::sleep_for(100ms);
      std::this_thread::sleep_for(500ms);  // the worker's report reaches the coordinator
    }
    t.transcript = ReadFile(follow_log);
    t.logs = Cli({"logs", t.job_id}).out;
    t.trial_seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    CleanUpStopped();
    if (fault == Fault::kKillWorker && !WaitWorkers(3, 30s)) {
      return fail("the killed worker did not come back READY");
    }
    t.ok = true;
    Check(&t);
    return t;
  }

  // kill -9 of the coordinator, then a new one on the same state folder and port.
  bool KillAndRestartCoordinator(std::string* why) {
    testing::KillNow(coordinator_);
    return StartCoordinator(why);
  }

  std::string WriteSpec(const std::string& name) {
    const fs::path spec = o_.dir / (name + ".yaml");
    std::ofstream(spec) << Spec(o_.dir / (name + "-checkpoints"));
    return spec.string();
  }

 private:
  // The trial's claims, each turned into `why` when it does not hold.
  void Check(TrialResult* t) const {
    auto claim = [&](bool holds, const std::string& what) {
      if (!holds && t->ok) {
        t->ok = false;
        t->why = what;
      }
    };
    claim(std::abs(t->final_loss - t->reference_loss) <= 1e-5 * std::abs(t->reference_loss),
          "final loss " + std::to_string(t->final_loss) + " != the undisturbed " +
              std::to_string(t->reference_loss));
    claim(t->follow_exit == 0, "submit --follow exited " + std::to_string(t->follow_exit) +
                                   ", not 0, for a job that SUCCEEDED");
    if (t->fault == Fault::kTermCoordinatorAtBarrier) {
      claim(t->at_barrier, "the coordinator's stop missed the checkpoint barrier");
    }
    if (HitsCoordinator(t->fault)) {
      // The ranks were alive throughout: the attempt must simply go on.
      claim(t->restarts == 0, "the coordinator's restart restarted the attempt (restarts " +
                                  std::to_string(t->restarts) + ")");
      claim(t->resumed_step == -1, "ranks resumed although nothing failed");
      return;
    }
    const int expected = t->fault == Fault::kKillRankInRestart ? 2 : 1;
    claim(t->restarts == expected,
          "restarts " + std::to_string(t->restarts) + ", expected " + std::to_string(expected));
    // Rank 0 of the next attempt resumes from the newest complete checkpoint it finds
    // (decision 0048): the newest when the attempt was placed. One interval older is still
    // accepted, as when the coordinator chose from rank 0's reports (a report could die with the
    // killed process: CI saw step 12 complete at a worker kill and a resume from 8).
    // The survivors may have completed one after the fault (every shard was already written),
    // never a newer one.
    const int reported_floor = t->newest_at_restart - o_.every;
    claim(t->resumed_step == t->newest_at_restart ||
              (t->resumed_step == reported_floor && reported_floor > 0),
          "resumed from step " + std::to_string(t->resumed_step) +
              " but the newest complete checkpoint at the restart was " +
              std::to_string(t->newest_at_restart) + " (one interval older is allowed: its report" +
              " can die with the killed process)");
    // The job's step in `status` comes from the ranks' step reports and may lag the ranks (a
    // loaded machine: CI saw status at step 32 with step 36's checkpoint already complete); the
    // victim had then reached at least the newest complete checkpoint, and the survivors can have
    // finished at most the one after it.
    const int reached = std::max(t->fault_at_step, t->newest_complete);
    const int newest_allowed = reached > t->fault_at_step ? reached + o_.every : reached + 1;
    const int oldest_allowed = t->resumed_step == reported_floor
                                   ? std::min(reported_floor, t->newest_complete)
                                   : t->newest_complete;
    claim(t->resumed_step >= oldest_allowed && t->resumed_step <= newest_allowed,
          "resumed from step " + std::to_string(t->resumed_step) + ", outside [" +
              std::to_string(oldest_allowed) + ", " + std::to_string(newest_allowed) + "]");
    if (t->fault == Fault::kStopRank) {
      // The hang is found by a bounded wait that names what it waited for: the collective
      // timeout (the collective and its group) or, inside a checkpoint, the barrier's store
      // wait (the key, which names the missing rank); the stopped rank is named as hung.
      bool timeout = false, named = false;
      for (const std::string& line : Lines(t->transcript + "\n" + t->logs)) {
        const bool collective = line.find("timeout") != std::string::npos &&
                                (line.find("all_") != std::string::npos ||
                                 line.find("reduce_scatter") != std::string::npos ||
                                 line.find("broadcast") != std::string::npos);
        const bool barrier = line.find("checkpoint/") != std::string::npos &&
                             line.find("not set within") != std::string::npos;
        timeout = timeout || collective || barrier;
        named = named || (line.rfind("[rank " + std::to_string(t->victim_rank), 0) == 0 &&
                          line.find("a hung rank") != std::string::npos);
      }
      claim(timeout, "no timeout naming the collective or barrier in the job's events or logs");
      claim(named, "the stopped rank " + std::to_string(t->victim_rank) +
                       " is not named as hung in the job's logs");
    }
  }

  template <typename Pred>
  bool WaitStatus(const std::string& job, Pred pred, Clock::time_point give_up, json* last) const {
    while (Clock::now() < give_up) {
      *last = Status(job);
      if (last->is_object() && pred(*last)) return true;
      if (last->is_object() && (*last)["state"] != "RUNNING" && (*last)["state"] != "PENDING") {
        return false;
      }
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  bool WaitWorkers(int n, std::chrono::seconds timeout) const {
    const Clock::time_point give_up = Clock::now() + timeout;
    while (Clock::now() < give_up) {
      CliResult r = Cli({"workers", "-o", "json"});
      if (r.exit_code == 0) {
        json list = json::parse(r.out, nullptr, false);
        int ready = 0;
        if (list.is_array()) {
          for (const json& w : list) ready += w["state"] == "READY";
        }
        if (ready >= n) return true;
      }
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  // SIGTERM to the coordinator, and its exit (reaped) within 20 s.
  bool TermCoordinator() {
    if (coordinator_.pid <= 0) return false;
    kill(coordinator_.pid, SIGTERM);
    const bool exited = testing::WaitExit(coordinator_.pid, 20s);
    if (!exited) testing::KillNow(coordinator_);
    coordinator_.pid = -1;
    return exited;
  }

  // Stops the coordinator inside a checkpoint's barrier, held open, at the checkpoint of step
  // `from` or a later one. A rank writes its shard (rank-NNNNN.safetensors, renamed into place
  // when complete) and only then makes its barrier call to the coordinator's store, and no rank
  // passes the barrier while the coordinator that serves the store is stopped. So the
  // coordinator is SIGSTOPped once the checkpoint before (C − every) is complete; when the stop
  // has taken effect, C having no shard yet proves that no rank has made C's barrier call. The
  // ranks train on (they need no coordinator between checkpoints) and write C's shards: both on
  // disk prove both ranks inside the barrier, open until the coordinator answers. Then SIGTERM
  // and SIGCONT. A checkpoint C begun before the stop is let go (SIGCONT) and the next one is
  // tried; the time to catch one is a whole checkpoint interval (the ranks' steps from C − every
  // to C), not the instant between a folder appearing and its barrier completing. The stop lasts
  // at most half the heartbeat timeout (a longer one could expire the workers' leases when the
  // coordinator resumes): where an interval is longer than that, the stop comes later, the last
  // measured interval minus half that hold after the completion. `caught`: C; `fault_time`: the
  // SIGTERM. False when no barrier was caught before `give_up` or the coordinator did not exit.
  // 1: caught and exited; 0: caught, did not exit within 20 s; -1: no barrier caught (the
  // coordinator runs on).
  int TermCoordinatorAtBarrier(const fs::path& checkpoints, int from, Clock::time_point give_up,
                               int* caught, Clock::time_point* fault_time) {
    const auto hold = std::chrono::milliseconds(500 * o_.heartbeat_timeout_s);
    Clock::duration lead{0};
    int newest = -1;  // the newest complete checkpoint seen, and when it was first seen
    Clock::time_point newest_at{};
    for (int next = from; next <= o_.steps && Clock::now() < give_up && coordinator_.pid > 0;
         next += o_.every) {
      // C − every complete (polled; a complete checkpoint stays complete).
      while (newest < next - o_.every && Clock::now() < give_up) {
        const int seen = NewestComplete(checkpoints);
        if (seen > newest) {
          const Clock::time_point now = Clock::now();
          if (newest >= 0 && seen == newest + o_.every) {
            lead = std::max(Clock::duration{0}, (now - newest_at) - hold / 2);
          }
          newest = seen;
          newest_at = now;
        } else {
          std::this_thread::sleep_for(1ms);
        }
      }
      if (newest >= next) {  // seen too late: the next one
        next = newest;
        continue;
      }
      std::this_thread::sleep_for(lead);
      kill(coordinator_.pid, SIGSTOP);
      if (!WaitStopped(coordinator_.pid, 1s)) {
        kill(coordinator_.pid, SIGCONT);
        continue;
      }
      const Clock::time_point stopped = Clock::now();
      const fs::path dir = checkpoints / StepName(next);
      if (ShardsOn(dir) > 0) {  // begun before the stop: its barrier call may be answered
        kill(coordinator_.pid, SIGCONT);
        continue;
      }
      while (ShardsOn(dir) < 2 && Clock::now() < stopped + hold) {
        std::this_thread::sleep_for(1ms);
      }
      if (ShardsOn(dir) < 2 || fs::exists(dir / "metadata.json")) {
        kill(coordinator_.pid, SIGCONT);
        continue;
      }
      *caught = next;
      *fault_time = Clock::now();
      kill(coordinator_.pid, SIGTERM);
      kill(coordinator_.pid, SIGCONT);
      const bool exited = testing::WaitExit(coordinator_.pid, 20s);
      if (!exited) testing::KillNow(coordinator_);
      coordinator_.pid = -1;
      return exited ? 1 : 0;
    }
    return -1;
  }

  // Whether `pid` is stopped (state T in /proc/PID/stat) within `timeout`.
  static bool WaitStopped(pid_t pid, std::chrono::milliseconds timeout) {
    const Clock::time_point until = Clock::now() + timeout;
    const std::string stat = "/proc/" + std::to_string(pid) + "/stat";
    while (Clock::now() < until) {
      const std::string text = ReadFile(stat);
      const size_t paren = text.rfind(')');  // the command name may hold spaces
      if (paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'T') {
        return true;
      }
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

  // "step-00000012", as the trainer names a checkpoint's folder.
  static std::string StepName(int step) {
    char name[32];
    std::snprintf(name, sizeof(name), "step-%08d", step);
    return name;
  }

  // How many ranks' shards (of the 2) are complete in a checkpoint's folder.
  static int ShardsOn(const fs::path& dir) {
    int n = 0;
    for (const char* shard : {"rank-00000.safetensors", "rank-00001.safetensors"}) {
      n += fs::exists(dir / shard) ? 1 : 0;
    }
    return n;
  }

  // Reaps `pid` within `timeout`: its exit code, 128 + signal, or -1 when it is still running.
  static int WaitExitCode(pid_t pid, std::chrono::milliseconds timeout) {
    const Clock::time_point until = Clock::now() + timeout;
    while (Clock::now() < until) {
      int status = 0;
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (r < 0) return -1;
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }

  // The newest step-N folder of `dir` whose metadata.json is in place (-1: none).
  static int NewestComplete(const fs::path& dir) {
    int newest = -1;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (n.rfind("step-", 0) != 0 || !fs::exists(it->path() / "metadata.json")) continue;
      newest = std::max(newest, std::atoi(n.c_str() + 5));
    }
    return newest;
  }

  // A SIGSTOPped rank the worker did not kill (it should have) goes now.
  void CleanUpStopped() {
    for (pid_t pid : stopped_) {
      if (testing::Alive(pid)) {
        kill(pid, SIGKILL);
        kill(pid, SIGCONT);
      }
    }
    stopped_.clear();
  }

  Options o_;
  std::vector<pid_t> stopped_;
  int trials_ = 0;
};

}  // namespace meshrun::chaos
