// nccl-tests-style benchmark of this host's Gloo (TCP loopback) through meshrun's
// Communicator: forks N ranks that bootstrap through a FileStore, sweeps buffer sizes for
// all_reduce, all_gather and reduce_scatter, and prints size, count, time, algbw, busbw and
// #wrong per size, then one JSON line per (op, ranks).
//
//   collectives [-g 2,4] [-b 1K] [-e 64M] [-f 4] [-n 20] [-w 5] [--ops all_reduce,...]
//
// Sizes are nccl-tests' S: the buffer for all_reduce, the gathered output for all_gather, the
// input for reduce_scatter (rounded down to a multiple of 4·N bytes). Time is the mean over
// ranks of the mean over iterations. algbw = S/time; busbw = algbw·2(N−1)/N for all_reduce and
// algbw·(N−1)/N for the others (docs/parallelism.md). #wrong counts wrong elements, summed over
// ranks, in one extra verified call per size.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/comm/gloo_backend.h"
#include "engine/comm/store.h"

namespace meshrun {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchConfig {
  std::vector<int> ranks = {2, 4};
  size_t min_bytes = 1024;
  size_t max_bytes = 64u << 20;
  int factor = 4;
  int iters = 20;
  int warmup = 5;
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter"};
  int timeout_s = 120;
  std::string hostname = "127.0.0.1";
};

// "64M" -> 67108864. Suffixes K, M, G are powers of 1024, as in nccl-tests.
bool ParseSize(const std::string& text, size_t* out) {
  if (text.empty()) return false;
  size_t mult = 1;
  std::string digits = text;
  switch (std::toupper(static_cast<unsigned char>(text.back()))) {
    case 'K': mult = 1ull << 10; break;
    case 'M': mult = 1ull << 20; break;
    case 'G': mult = 1ull << 30; break;
    default: break;
  }
  if (mult != 1) digits.pop_back();
  try {
    size_t pos = 0;
    const unsigned long long v = std::stoull(digits, &pos);
    if (pos != digits.size()) return false;
    *out = static_cast<size_t>(v) * mult;
    return true;
  } catch (...) {
    return false;
  }
}

double BusFactor(CommOp op, int n) {
  return op == CommOp::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

struct Row {
  size_t bytes = 0;
  size_t count = 0;  // floats in S
  double time_us = 0;
  double algbw = 0;  // GB/s
  double busbw = 0;
  long wrong = 0;
};

// Expected values are small integers, so every summation order gives them exactly.
float Pattern(int rank, size_t i) {
  return static_cast<float>((rank + 1) * (i % 7 + 1));
}

// One timed and one verified run of `op` with S = `bytes` on this rank.
StatusOr<Row> RunSize(Communicator& comm, CommOp op, size_t bytes, const BenchConfig& cfg) {
  const int n = comm.size();
  const int r = comm.rank();
  const size_t total = bytes / sizeof(float) / n * n;  // floats in S, a multiple of n
  const size_t chunk = total / n;
  std::vector<float> big(total, 0.f), small(chunk, 0.f);
  auto call = [&]() -> Status {
    switch (op) {
      case CommOp::kAllReduce: return comm.AllReduce(big.data(), total);
      case CommOp::kAllGather: return comm.AllGather(small.data(), big.data(), chunk);
      default: return comm.ReduceScatter(big.data(), small.data(), chunk);
    }
  };
  for (int i = 0; i < cfg.warmup; ++i) MESHRUN_RETURN_IF_ERROR(call());
  MESHRUN_RETURN_IF_ERROR(comm.Barrier());
  const auto start = Clock::now();
  for (int i = 0; i < cfg.iters; ++i) MESHRUN_RETURN_IF_ERROR(call());
  float seconds = std::chrono::duration<float>(Clock::now() - start).count() / cfg.iters;

  // Verification pass with a known pattern.
  for (size_t i = 0; i < total; ++i) big[i] = Pattern(r, i);
  for (size_t i = 0; i < chunk; ++i) small[i] = Pattern(r, r * chunk + i);
  MESHRUN_RETURN_IF_ERROR(call());
  long wrong = 0;
  const float tri = static_cast<float>(n * (n + 1) / 2);
  if (op == CommOp::kAllReduce) {
    for (size_t i = 0; i < total; ++i) wrong += big[i] != tri * (i % 7 + 1);
  } else if (op == CommOp::kAllGather) {
    for (size_t i = 0; i < total; ++i) wrong += big[i] != Pattern(static_cast<int>(i / chunk), i);
  } else {
    for (size_t i = 0; i < chunk; ++i) wrong += small[i] != tri * ((r * chunk + i) % 7 + 1);
  }

  float sums[2] = {seconds, static_cast<float>(wrong)};
  MESHRUN_RETURN_IF_ERROR(comm.AllReduce(sums, 2));
  Row row;
  row.bytes = total * sizeof(float);
  row.count = total;
  row.time_us = sums[0] / n * 1e6;
  row.wrong = static_cast<long>(sums[1]);
  row.algbw = row.bytes / (row.time_us * 1e-6) / 1e9;
  row.busbw = row.algbw * BusFactor(op, n);
  return row;
}

// Rank body: connect, sweep, print (rank 0). Returns the process exit code.
int RunRank(int rank, int n, const std::string& dir, const BenchConfig& cfg) {
  auto store = FileStore::Create(dir);
  auto backend = GlooBackend::Create(GlooOptions{cfg.hostname, ""});
  if (!store.ok() || !backend.ok()) {
    std::fprintf(stderr, "error: rank %d: %s\n", rank,
                 (!store.ok() ? store.status() : backend.status()).ToString().c_str());
    return 1;
  }
  CommConfig config{
      MeshAxis::kDp, "bench/" + std::to_string(n), rank, n, std::chrono::seconds(cfg.timeout_s),
      nullptr};
  auto comm = (*backend)->Connect(config, std::make_shared<PrefixStore>(config.group_id, *store));
  if (!comm.ok()) {
    std::fprintf(stderr, "error: rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 1;
  }
  if (rank == 0) {
    std::printf("# gloo over TCP %s, %d ranks, iters %d, warmup %d\n#\n", cfg.hostname.c_str(), n,
                cfg.iters, cfg.warmup);
    std::printf("# %14s %12s %-15s %10s %8s %8s %7s\n", "size", "count", "op", "time", "algbw",
                "busbw", "#wrong");
    std::printf("# %14s %12s %-15s %10s %8s %8s %7s\n", "(B)", "(floats)", "", "(us)", "(GB/s)",
                "(GB/s)", "");
  }
  nlohmann::json lines = nlohmann::json::array();
  for (const std::string& op_name : cfg.ops) {
    const CommOp op = op_name == "all_reduce"   ? CommOp::kAllReduce
                      : op_name == "all_gather" ? CommOp::kAllGather
                                                : CommOp::kReduceScatter;
    nlohmann::json results = nlohmann::json::array();
    double busbw_sum = 0;
    long wrong_total = 0;
    for (size_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= cfg.factor) {
      if (bytes / sizeof(float) / n == 0) continue;
      auto row = RunSize(**comm, op, bytes, cfg);
      if (!row.ok()) {
        std::fprintf(stderr, "error: rank %d: %s\n", rank, row.status().ToString().c_str());
        return 1;
      }
      busbw_sum += row->busbw;
      wrong_total += row->wrong;
      if (rank == 0) {
        std::printf("  %14zu %12zu %-15s %10.1f %8.3f %8.3f %7ld\n", row->bytes, row->count,
                    op_name.c_str(), row->time_us, row->algbw, row->busbw, row->wrong);
        std::fflush(stdout);
        results.push_back({{"size", row->bytes},
                           {"count", row->count},
                           {"time_us", row->time_us},
                           {"algbw_gbps", row->algbw},
                           {"busbw_gbps", row->busbw},
                           {"wrong", row->wrong}});
      }
      if (bytes > cfg.max_bytes / cfg.factor) break;  // no overflow past max
    }
    if (rank == 0) {
      lines.push_back({{"bench", "collectives"},
                       {"backend", "gloo"},
                       {"transport", "tcp"},
                       {"op", op_name},
                       {"ranks", n},
                       {"iters", cfg.iters},
                       {"warmup", cfg.warmup},
                       {"avg_busbw_gbps", results.empty() ? 0.0 : busbw_sum / results.size()},
                       {"wrong", wrong_total},
                       {"results", results}});
    }
  }
  if (rank == 0) {
    std::printf("#\n");
    for (const auto& line : lines) std::printf("%s\n", line.dump().c_str());
  }
  return 0;
}

// Forks n ranks on a fresh store directory and waits for them; the exit code of the worst.
int RunWorld(int n, const BenchConfig& cfg) {
  char tmpl[] = "/tmp/meshrun-bench-collectives-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("error: mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int code = RunRank(rank, n, dir, cfg);
      std::fflush(stdout);
      ::_exit(code);
    }
    if (pid < 0) {
      std::perror("error: fork");
      for (pid_t p : pids) ::kill(p, SIGKILL);
      return 1;
    }
    pids.push_back(pid);
  }
  int worst = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (code != 0) {
      worst = 1;
      for (pid_t p : pids) ::kill(p, SIGKILL);  // a failed rank would leave the others waiting
    }
  }
  std::filesystem::remove_all(dir);
  return worst;
}

}  // namespace
}  // namespace meshrun

int main(int argc, char** argv) {
  meshrun::BenchConfig cfg;
  std::string min_text = "1K", max_text = "64M";
  CLI::App app{"Gloo collectives benchmark (nccl-tests style) over meshrun's Communicator"};
  app.add_option("-g,--ranks", cfg.ranks, "rank counts to run, e.g. -g 2,4")->delimiter(',');
  app.add_option("-b,--minbytes", min_text, "smallest size (K, M, G suffixes)");
  app.add_option("-e,--maxbytes", max_text, "largest size");
  app.add_option("-f,--stepfactor", cfg.factor, "size multiplier")->check(CLI::Range(2, 1024));
  app.add_option("-n,--iters", cfg.iters, "timed iterations per size")
      ->check(CLI::Range(1, 1000000));
  app.add_option("-w,--warmup_iters", cfg.warmup, "untimed iterations per size")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--ops", cfg.ops, "ops to run")
      ->delimiter(',')
      ->check(CLI::IsMember({"all_reduce", "all_gather", "reduce_scatter"}));
  app.add_option("--timeout", cfg.timeout_s, "per-call timeout in seconds")
      ->check(CLI::Range(1, 3600));
  app.add_option("--hostname", cfg.hostname, "address the ranks bind and connect to");
  CLI11_PARSE(app, argc, argv);

  if (!meshrun::ParseSize(min_text, &cfg.min_bytes) ||
      !meshrun::ParseSize(max_text, &cfg.max_bytes) || cfg.min_bytes == 0 ||
      cfg.min_bytes > cfg.max_bytes) {
    std::fprintf(stderr,
                 "error: -b/-e: sizes must be positive with -b <= -e, got %s and %s "
                 "(hint: e.g. -b 1K -e 64M)\n",
                 min_text.c_str(), max_text.c_str());
    return 2;
  }
  for (int n : cfg.ranks) {
    if (n < 2 || n > 64) {
      std::fprintf(stderr, "error: -g: rank counts must be in [2, 64], got %d (hint: -g 2,4)\n", n);
      return 2;
    }
  }
  int code = 0;
  for (int n : cfg.ranks) code = std::max(code, meshrun::RunWorld(n, cfg));
  return code;
}
