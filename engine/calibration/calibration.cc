// The measurements of calibration.h. The all-reduce runs n threads of this process, each with
// its own Gloo context over 127.0.0.1, bootstrapped through an in-memory store: the same code
// path (Gloo's TCP transport, loopback) that ranks on one host use.
#include "engine/calibration/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/comm/gloo_backend.h"
#include "engine/comm/store.h"
#include "engine/kernels/cpu/kernels.h"

namespace meshrun {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

double MeasureGemmFlops(int threads) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::SetNumThreads(threads > 0 ? threads : cores);
  return cpu::MeasureMatmulFlops();
}

StatusOr<LoopbackFigures> MeasureLoopbackAllReduce(int ranks, size_t bytes, int iterations) {
  if (ranks < 2) return LoopbackFigures{};
  MESHRUN_ASSIGN_OR_RETURN(std::shared_ptr<GlooBackend> backend, GlooBackend::Create());
  auto store = std::make_shared<InMemoryStore>();
  const size_t count = std::max<size_t>(1, bytes / sizeof(float));
  iterations = std::max(1, iterations);
  std::vector<Status> status(ranks);
  // Per rank: the timed calls of the big buffer, then of one float.
  std::vector<std::vector<double>> times(ranks), small(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      CommConfig config;
      config.axis = MeshAxis::kDp;  // a data-parallel all-reduce; uncounted (no stats)
      config.group_id = "calibration";
      config.rank = r;
      config.size = ranks;
      config.timeout = std::chrono::seconds(30);
      StatusOr<std::unique_ptr<Communicator>> comm = backend->Connect(config, store);
      if (!comm.ok()) {
        status[r] = comm.status();
        return;
      }
      std::vector<float> data(count, 1.0f);
      for (int i = 0; i <= iterations; ++i) {
        if (status[r] = (*comm)->Barrier(); !status[r].ok()) return;
        const auto t0 = Clock::now();
        if (status[r] = (*comm)->AllReduce(data.data(), count); !status[r].ok()) return;
        if (i > 0) times[r].push_back(Seconds(t0, Clock::now()));  // the first warms up
      }
      for (int i = 0; i <= iterations; ++i) {
        if (status[r] = (*comm)->Barrier(); !status[r].ok()) return;
        const auto t0 = Clock::now();
        if (status[r] = (*comm)->AllReduce(data.data(), 1); !status[r].ok()) return;
        if (i > 0) small[r].push_back(Seconds(t0, Clock::now()));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) MESHRUN_RETURN_IF_ERROR(s);
  // A call ends for all when the slowest rank's does: the per-iteration maximum, then the median.
  auto median_of_slowest = [&](const std::vector<std::vector<double>>& t) {
    std::vector<double> slowest(iterations, 0);
    for (int r = 0; r < ranks; ++r) {
      for (int i = 0; i < iterations; ++i) slowest[i] = std::max(slowest[i], t[r][i]);
    }
    std::sort(slowest.begin(), slowest.end());
    return slowest[iterations / 2];
  };
  const double median = median_of_slowest(times);
  const double bus_bytes = static_cast<double>(count * sizeof(float)) * 2.0 * (ranks - 1) / ranks;
  LoopbackFigures out;
  out.bus_bandwidth = median > 0 ? bus_bytes / median : 0.0;
  out.latency = median_of_slowest(small);
  return out;
}

StatusOr<HostCalibration> CalibrateHost(const CalibrationOptions& options) {
  HostCalibration out;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  out.threads = options.threads > 0 ? options.threads : cores;
  out.gemm_flops = MeasureGemmFlops(out.threads);
  out.loopback_ranks = options.ranks;
  MESHRUN_ASSIGN_OR_RETURN(
      LoopbackFigures loopback,
      MeasureLoopbackAllReduce(options.ranks, options.bytes, options.iterations));
  out.loopback_bus_bandwidth = loopback.bus_bandwidth;
  out.loopback_latency = loopback.latency;
  return out;
}

RobustFigure Robust(std::vector<double> samples) {
  RobustFigure out;
  if (samples.empty()) return out;
  auto median_of = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  out.median = median_of(samples);
  std::vector<double> deviations;
  for (double x : samples) deviations.push_back(std::fabs(x - out.median));
  const double mad = median_of(deviations);
  out.spread = out.median != 0 ? mad / std::fabs(out.median) : 0.0;
  return out;
}

StatusOr<HostCalibration> CalibrateHostRepeated(const CalibrationOptions& options, int rounds,
                                                std::vector<HostCalibration>* samples) {
  rounds = std::max(1, rounds);
  std::vector<HostCalibration> runs;
  for (int i = 0; i <= rounds; ++i) {
    MESHRUN_ASSIGN_OR_RETURN(HostCalibration run, CalibrateHost(options));
    if (i > 0) runs.push_back(run);  // round 0 warms up
  }
  auto median = [&](double HostCalibration::*field) {
    std::vector<double> v;
    for (const HostCalibration& r : runs) v.push_back(r.*field);
    return Robust(std::move(v)).median;
  };
  HostCalibration out = runs.front();
  out.gemm_flops = median(&HostCalibration::gemm_flops);
  out.loopback_bus_bandwidth = median(&HostCalibration::loopback_bus_bandwidth);
  out.loopback_latency = median(&HostCalibration::loopback_latency);
  if (samples != nullptr) *samples = std::move(runs);
  return out;
}

}  // namespace meshrun
