// The planner's link to the world outside the pure planner: this host calibrated as a cluster
// (`meshrun plan --calibrate`, `meshrun train --nproc N` with parallelism.auto), the
// coordinator's registered workers as a cluster (`meshrun plan --coordinator`, `meshrun
// submit`), and the submission's choice and prediction. Not thread-safe (calibration sets the
// kernels' thread count).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/coordinator_client.h"
#include "common/status.h"
#include "coordinator/plan_submission.h"
#include "engine/calibration/calibration.h"
#include "engine/train/planner.h"
#include "meshrun/v1/types.pb.h"

namespace meshrun::client {

// One node of `per_node` ranks on this host: its GEMM rate over all cores and its loopback
// all-reduce (per_node ranks, at least 2, at most 8) measured now, shared by the ranks. Each
// figure is the median of kCalibrationRounds measurements after a warm-up
// (CalibrateHostRepeated); `rounds` (when given) receives the cluster of each measurement, for
// the spread of a prediction (PredictionSpread).
inline constexpr int kCalibrationRounds = 5;
StatusOr<ClusterShape> CalibratedHostCluster(int per_node,
                                             std::vector<ClusterShape>* rounds = nullptr);

// The step time of `spec` (its own configuration, PredictConfiguration) on each of `rounds`:
// their median and spread (engine/calibration's Robust), e.g. for "0.41 s/step ±4%".
RobustFigure PredictionSpread(const JobSpec& spec, const std::vector<ClusterShape>& rounds);

// meshrun::ClusterOfWorkers (coordinator/plan_submission.h) planned from this host.
StatusOr<ClusterShape> ClusterOfWorkers(const std::vector<v1::WorkerInfo>& workers,
                                        const std::string& device);

// {"chosen":{mesh},"predicted_step_seconds","predicted_peak_memory_bytes","runner_up":{…},
// "text"} of a choice.
nlohmann::ordered_json MeshChoiceJson(const MeshChoice& choice);

// For `meshrun train --nproc N` with parallelism.auto: the choice for N ranks on this host
// (calibrated now), reported on stderr and, with `json`, as the line
// {"event":"auto",…MeshChoiceJson} on stdout before the ranks start.
StatusOr<MeshChoice> ChooseMeshOnHost(const JobSpec& spec, int nproc, bool json);

}  // namespace meshrun::client
