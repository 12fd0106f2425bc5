// The job spec in its two forms: meshrun.v1.JobSpec (what travels over gRPC) and
// meshrun::JobSpec (common/, what ValidateJobSpec checks). Pure functions, no I/O.
#pragma once

#include "common/job_spec.h"
#include "common/status.h"
#include "meshrun/v1/job_spec.pb.h"

namespace meshrun {

// Converts field by field. INVALID_ARGUMENT naming the field when a value does not fit the
// common struct (an int64 above INT32_MAX), or when a model size is missing although
// model.init_from is empty. With model.init_from set, missing sizes are filled with
// placeholders that satisfy every rule of docs/job-spec.md (n_head = tp_size, d_model =
// n_head·tp_size, seq_len = 2·cp_size, vocab_size = 256, n_layer = 1): the engine reads the
// real ones from config.json at rank start and reports contradictions there.
StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& proto);

// The other direction, every field set (the model sizes always present); source_yaml and
// set_overrides left empty.
v1::JobSpec JobSpecToProto(const JobSpec& spec);

// JobSpecFromProto, then ValidateJobSpec: the coordinator's one check of a submitted spec.
// Errors are INVALID_ARGUMENT with the `<field>: <what> (hint: <fix>)` message of common/.
StatusOr<JobSpec> ValidateProtoJobSpec(const v1::JobSpec& proto);

}  // namespace meshrun
