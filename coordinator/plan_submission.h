// The planner applied to a submission in its wire form: the registered workers as a cluster,
// `parallelism.auto` resolved for them, and the prediction of the spec as it will run. Its one
// caller for submissions is the coordinator's SubmitJob (decision 0048): `meshrun submit` and
// any gRPC client send `parallelism.auto` unresolved, and `meshrun submit` sees the choice in a
// dry run's answer (SubmitJobResponse.spec) before it submits that spec (docs/planning.md).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/train/planner.h"
#include "meshrun/v1/job_spec.pb.h"
#include "meshrun/v1/types.pb.h"

namespace meshrun {

// What the planning process knows of its own host, for figures the workers did not report:
// its memory (the workers report none; every rank of a host shares it) and, asked only when no
// worker calibrated, its GEMM rate on all cores.
struct PlanningHost {
  double memory_bytes = 0;
  std::function<double()> gemm_flops;
};

// This host: its memory (the smaller of the physical memory and the cgroup's limit) and its GEMM
// rate on all cores (engine/calibration, measured when first asked and kept).
double HostMemoryBytes();
PlanningHost ThisPlanningHost();

// The live workers of `device` as a cluster: nodes = workers, ranks per node = the fewest
// slots among them, the figures each reported at registration (the slowest counts). Workers
// that share one address share one host: its cores are divided among all their ranks, and its
// loopback is the link across them too. GPU workers get the h100 profile. FAILED_PRECONDITION
// when none is live.
StatusOr<ClusterShape> ClusterOfWorkers(const std::vector<v1::WorkerInfo>& workers,
                                        const std::string& device, const PlanningHost& host);

// With parallelism.auto: chooses the mesh for the registered workers (every slot of the live
// workers of the spec's device) and writes it into `spec` (the sizes, auto false,
// auto_choice: the choice and its runner-up). Then, for every spec, the prediction of the spec
// as it will run (predicted_step_seconds, predicted_peak_memory_bytes). `workers` is what
// ListWorkers answered; without a live worker a spec without auto is left unpredicted and an
// auto one is INVALID_ARGUMENT (nothing to plan for), as is one that no mesh fits. `note`
// receives the choice's text (empty without auto).
Status PlanSubmission(const StatusOr<std::vector<v1::WorkerInfo>>& workers,
                      const PlanningHost& host, v1::JobSpec* spec, std::string* note);

}  // namespace meshrun
