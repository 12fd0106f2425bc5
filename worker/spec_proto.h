// Conversion between the job spec structs of common/ (what the YAML reader fills and
// ValidateJobSpec checks) and the meshrun.v1.JobSpec message that travels through the control
// plane. Field for field; used by the client (submit) and the worker (spec.yaml of a rank).
#pragma once

#include "common/job_spec.h"
#include "common/status.h"
#include "meshrun/v1/job_spec.pb.h"

namespace meshrun {

// Every field of `spec`; source_yaml and set_overrides are left for the caller to fill.
v1::JobSpec JobSpecToProto(const JobSpec& spec);

// The structs of a message. Model sizes that the message leaves unset keep their defaults;
// values outside the structs' int range are INVALID_ARGUMENT naming the field. The result is
// not validated: call ValidateJobSpec.
StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& proto);

}  // namespace meshrun
