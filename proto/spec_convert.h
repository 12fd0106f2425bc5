// The job spec in its two forms: meshrun.v1.JobSpec (what travels over gRPC) and
// meshrun::JobSpec (common/, what ValidateJobSpec checks). Pure functions, no I/O.
#pragma once

#include "common/job_spec.h"
#include "common/status.h"
#include "meshrun/v1/job_spec.pb.h"

namespace meshrun {

// Converts field by field. A field the message leaves unset (every field is `optional`) keeps
// the default of common/job_spec.h, the same default a YAML spec that leaves it out gets, so a
// minimal spec from any gRPC client resolves as the same minimal YAML does. INVALID_ARGUMENT
// naming the field when a value does not fit the common struct (an int64 above INT32_MAX).
// With model.init_from set, missing model sizes are filled with placeholders that satisfy
// every rule of the mesh (n_head = tp_size, d_model = n_head·tp_size, seq_len = 2·cp_size,
// vocab_size = 256, n_layer = 1): the rank replaces them with config.json's before it
// validates (rank/spec_intake.h, decision 0048).
StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& proto);

// The other direction, every field set (the model sizes always present); source_yaml and
// set_overrides left empty.
v1::JobSpec JobSpecToProto(const JobSpec& spec);

// JobSpecFromProto, then ValidateJobSpec: the coordinator's one check of a submitted spec.
// Errors are INVALID_ARGUMENT with the `<field>: <what> (hint: <fix>)` message of common/.
StatusOr<JobSpec> ValidateProtoJobSpec(const v1::JobSpec& proto);

// What the coordinator stores and sends to the ranks for a submitted spec: `resolved` (the
// result of ValidateProtoJobSpec) with every field set, the submitted source_yaml and
// set_overrides, and, with model.init_from set, the model section as the client sent it: the
// fields it left out stay unset (each rank reads them from config.json, not the placeholders).
v1::JobSpec ResolvedJobSpecProto(const v1::JobSpec& submitted, const JobSpec& resolved);

// Whether the model's sizes travel in `proto` (no model.init_from, or one with n_layer, d_model,
// vocab_size and seq_len given): then the worker knows them and checks a rank's memory before it
// starts; otherwise only the rank does, once it has read init_from's config.json.
bool ModelSizesSent(const v1::JobSpec& proto);

}  // namespace meshrun
