// Calibrated clusters and the submission's plan (plan_support.h).
#include "client/plan_support.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <thread>

#include "client/preflight.h"
#include "common/job_spec.h"
#include "engine/calibration/calibration.h"
#include "proto/spec_convert.h"

namespace meshrun::client {

namespace {

using json = nlohmann::ordered_json;

json MeshJson(const ParallelismSpec& p) {
  return {{"dp_replicate", p.dp_replicate_size},
          {"dp_shard", p.dp_shard_size},
          {"cp", p.cp_size},
          {"tp", p.tp_size}};
}

}  // namespace

StatusOr<ClusterShape> CalibratedHostCluster(int per_node) {
  CalibrationOptions options;
  options.ranks = std::clamp(per_node, 2, 8);
  options.bytes = size_t{1} << 20;
  options.iterations = 5;
  MESHRUN_ASSIGN_OR_RETURN(HostCalibration measured, CalibrateHost(options));
  ClusterShape cluster;
  cluster.nodes = 1;
  cluster.per_node = per_node;
  cluster.device = CalibratedCpuProfile(measured.gemm_flops, HostMemoryBytes(), per_node,
                                        measured.loopback_bus_bandwidth, measured.loopback_latency);
  return cluster;
}

StatusOr<ClusterShape> ClusterOfWorkers(const std::vector<v1::WorkerInfo>& workers,
                                        const std::string& device) {
  std::vector<const v1::WorkerInfo*> live;
  std::set<std::string> addresses;
  for (const v1::WorkerInfo& w : workers) {
    if (w.state() == v1::WORKER_STATE_LOST || w.device() != device || w.slots() < 1) continue;
    live.push_back(&w);
    addresses.insert(w.address());
  }
  if (live.empty()) {
    return FailedPreconditionError("--coordinator: no live worker of device " + device +
                                   " is registered (hint: meshrun workers lists them; start "
                                   "one with meshrun-worker or meshrun up)");
  }
  ClusterShape cluster;
  cluster.nodes = static_cast<int>(live.size());
  cluster.per_node = live.front()->slots();
  double gemm = 0, bandwidth = 0, latency = 0;
  for (const v1::WorkerInfo* w : live) {
    cluster.per_node = std::min(cluster.per_node, w->slots());
    const v1::HostCalibration& c = w->calibration();
    if (c.gemm_flops() > 0) gemm = gemm > 0 ? std::min(gemm, c.gemm_flops()) : c.gemm_flops();
    if (c.loopback_bus_bandwidth() > 0) {
      bandwidth = bandwidth > 0 ? std::min(bandwidth, c.loopback_bus_bandwidth())
                                : c.loopback_bus_bandwidth();
    }
    latency = std::max(latency, c.loopback_latency_seconds());
  }
  const bool one_host = addresses.size() == 1;
  const int ranks_per_host = one_host ? cluster.world() : cluster.per_node;
  if (device == "cpu") {
    cluster.device =
        CalibratedCpuProfile(gemm, HostMemoryBytes(), ranks_per_host, bandwidth, latency);
    if (gemm <= 0) {
      // Workers that did not calibrate: this host's rate stands in for theirs.
      cluster.device.flops = MeasureGemmFlops(0) / static_cast<double>(std::max(1, ranks_per_host));
    }
    if (one_host) {
      cluster.device.inter_node_bw = cluster.device.intra_node_bw;
      cluster.device.inter_node_latency = cluster.device.intra_node_latency;
    }
  } else {
    MESHRUN_ASSIGN_OR_RETURN(cluster.device, DeviceProfileNamed("h100"));
  }
  return cluster;
}

json MeshChoiceJson(const MeshChoice& choice) {
  json out = {{"chosen", MeshJson(choice.spec.parallelism)},
              {"predicted_step_seconds", choice.best.step_seconds},
              {"predicted_peak_memory_bytes", choice.best.memory.peak_bytes}};
  if (choice.has_runner_up) {
    out["runner_up"] = {{"mesh", MeshJson(choice.runner_up.spec.parallelism)},
                        {"predicted_step_seconds", choice.runner_up.step_seconds},
                        {"predicted_peak_memory_bytes", choice.runner_up.memory.peak_bytes}};
  }
  out["text"] = choice.text;
  return out;
}

StatusOr<MeshChoice> ChooseMeshOnHost(const JobSpec& spec, int nproc, bool json_output) {
  MESHRUN_ASSIGN_OR_RETURN(ClusterShape cluster, CalibratedHostCluster(nproc));
  MESHRUN_ASSIGN_OR_RETURN(MeshChoice choice, ChooseMesh(spec, cluster));
  std::fprintf(stderr, "%s\n", choice.text.c_str());
  if (json_output) {
    json line = {{"event", "auto"}};
    line.update(MeshChoiceJson(choice));
    // The calibrated figures it planned with (`meshrun plan` takes each as an override).
    line["device"] = {{"memory_bytes", cluster.device.memory_bytes},
                      {"flops", cluster.device.flops},
                      {"intra_node_bw", cluster.device.intra_node_bw},
                      {"intra_node_latency", cluster.device.intra_node_latency}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  return choice;
}

Status PlanSubmission(CoordinatorClient& client, v1::JobSpec* proto, std::string* note) {
  note->clear();
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromProto(*proto));
  StatusOr<std::vector<v1::WorkerInfo>> workers = client.ListWorkers();
  StatusOr<ClusterShape> cluster = workers.ok() ? ClusterOfWorkers(*workers, spec.resources.device)
                                                : StatusOr<ClusterShape>(workers.status());
  if (!cluster.ok()) {
    if (!spec.parallelism.auto_mesh) return OkStatus();  // sent unpredicted
    return InvalidArgumentError(
        "parallelism.auto: there is nothing to plan for: " + cluster.status().message() +
        " (hint: start workers first, or give the sizes and set parallelism.auto: false)");
  }
  if (spec.parallelism.auto_mesh) {
    // The ranks available: every slot of the registered workers.
    MESHRUN_ASSIGN_OR_RETURN(MeshChoice choice, ChooseMesh(spec, *cluster));
    spec = choice.spec;
    v1::ParallelismSpec* p = proto->mutable_parallelism();
    p->set_auto_(false);
    p->set_dp_replicate_size(spec.parallelism.dp_replicate_size);
    p->set_dp_shard_size(spec.parallelism.dp_shard_size);
    p->set_cp_size(spec.parallelism.cp_size);
    p->set_tp_size(spec.parallelism.tp_size);
    proto->set_auto_choice(choice.text);
    *note = choice.text;
  }
  if (ValidateJobSpec(spec, cluster->world()).ok()) {
    const PlanRow row = PredictConfiguration(spec, *cluster);
    proto->set_predicted_step_seconds(row.step_seconds);
    proto->set_predicted_peak_memory_bytes(row.memory.peak_bytes);
  } else {
    // A job smaller than the cluster runs on some of its workers: plan it on as many nodes
    // as it needs (the coordinator's placement packs them).
    StatusOr<ParallelDims> mesh = MeshOf(spec);
    if (mesh.ok()) {
      ClusterShape part = *cluster;
      const int world = static_cast<int>(mesh->world_size());
      part.nodes = std::max(1, (world + part.per_node - 1) / part.per_node);
      if (part.world() != world) {
        part.nodes = 1;
        part.per_node = world;
      }
      if (ValidateJobSpec(spec, part.world()).ok()) {
        const PlanRow row = PredictConfiguration(spec, part);
        proto->set_predicted_step_seconds(row.step_seconds);
        proto->set_predicted_peak_memory_bytes(row.memory.peak_bytes);
      }
    }
  }
  return OkStatus();
}

}  // namespace meshrun::client
