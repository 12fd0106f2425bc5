// The submission's plan (plan_submission.h).
#include "coordinator/plan_submission.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <set>

#include "common/host_resources.h"
#include "common/job_spec.h"
#include "engine/calibration/calibration.h"
#include "proto/spec_convert.h"

namespace meshrun {

double HostMemoryBytes() {
  return ProbeHostResources().memory_bytes;  // cgroup-aware (common/host_resources.h)
}

PlanningHost ThisPlanningHost() {
  return PlanningHost{HostMemoryBytes(), [] {
                        static std::once_flag once;
                        static double flops = 0;
                        std::call_once(once, [] { flops = MeasureGemmFlops(0); });
                        return flops;
                      }};
}

StatusOr<ClusterShape> ClusterOfWorkers(const std::vector<v1::WorkerInfo>& workers,
                                        const std::string& device, const PlanningHost& host) {
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
  int latency_ranks = 0;  // of the slowest latency
  for (const v1::WorkerInfo* w : live) {
    cluster.per_node = std::min(cluster.per_node, w->slots());
    const v1::HostCalibration& c = w->calibration();
    if (c.gemm_flops() > 0) gemm = gemm > 0 ? std::min(gemm, c.gemm_flops()) : c.gemm_flops();
    if (c.loopback_bus_bandwidth() > 0) {
      bandwidth = bandwidth > 0 ? std::min(bandwidth, c.loopback_bus_bandwidth())
                                : c.loopback_bus_bandwidth();
    }
    if (c.loopback_latency_seconds() > latency) {
      latency = c.loopback_latency_seconds();
      latency_ranks = c.loopback_ranks();
    }
  }
  const bool one_host = addresses.size() == 1;
  const int ranks_per_host = one_host ? cluster.world() : cluster.per_node;
  if (device == "cpu") {
    cluster.device = CalibratedCpuProfile(gemm, host.memory_bytes, ranks_per_host, bandwidth,
                                          latency, latency_ranks);
    if (gemm <= 0 && host.gemm_flops) {
      // Workers that did not calibrate: this host's rate stands in for theirs.
      cluster.device.flops = host.gemm_flops() / static_cast<double>(std::max(1, ranks_per_host));
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

Status PlanSubmission(const StatusOr<std::vector<v1::WorkerInfo>>& workers,
                      const PlanningHost& host, v1::JobSpec* proto, std::string* note) {
  note->clear();
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromProto(*proto));
  // Under model.init_from the sizes left out are read by the ranks (decision 0048): nothing to
  // predict from here, and nothing to choose a mesh for.
  const v1::ModelSpec& m = proto->model();
  if (!m.init_from().empty() && !(m.has_n_layer() && m.has_n_head() && m.has_d_model() &&
                                  m.has_seq_len() && m.has_vocab_size())) {
    if (!spec.parallelism.auto_mesh) return OkStatus();
    return InvalidArgumentError(
        "parallelism.auto: the planner needs the model sizes, which model.init_from's "
        "config.json gives only where the ranks run (hint: give model.n_layer, n_head, "
        "d_model, seq_len and vocab_size, or the parallelism sizes)");
  }
  StatusOr<ClusterShape> cluster = workers.ok()
                                       ? ClusterOfWorkers(*workers, spec.resources.device, host)
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
    p->set_pp_size(spec.parallelism.pp_size);
    p->set_pp_schedule(spec.parallelism.pp_schedule);
    p->set_pp_virtual_stages(spec.parallelism.pp_virtual_stages);
    p->clear_pp_layers();
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

}  // namespace meshrun
