// The rank's one intake of its spec (decision 0048): the coordinator's message as the worker
// forwarded it, unchanged, read once into the struct the engine runs, with what only this host
// knows applied beside it (RankStart.threads, relative paths joined to its roots), the model sizes
// left out under model.init_from read from that folder's config.json (here, where the files are
// readable), and then the one validation of this process.
#pragma once

#include "common/job_spec.h"
#include "common/status.h"
#include "meshrun/v1/job_spec.pb.h"
#include "meshrun/v1/rank.pb.h"

namespace meshrun::rank {

// With model.init_from set, every field of `sent` that the message leaves unset becomes
// config.json's value (common/hf_config.h, the one mapping), or the spec's default where
// config.json has none (seq_len of the Llama family); fields the message sets are kept, and a
// contradiction with config.json is the engine's error at load. Without init_from, `spec` is
// left as it is. INVALID_ARGUMENT naming model.init_from when config.json cannot be read.
Status FillModelFromInitFrom(const v1::ModelSpec& sent, JobSpec* spec);

// JobSpecFromProto(start.assignment().spec()), threads and file roots from RankStart,
// FillModelFromInitFrom, then ValidateJobSpec against the assignment's world size. On cpu with
// the worker's --memory-bytes: RESOURCE_EXHAUSTED when the ranks on this host cannot hold this
// rank's step as the counting device counts it (engine/train/counted_step.h), before anything
// is allocated.
StatusOr<JobSpec> SpecOfRankStart(const v1::RankStart& start);

}  // namespace meshrun::rank
