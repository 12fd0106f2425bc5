// The rank's spec intake (see spec_intake.h).
#include "rank/spec_intake.h"

#include <algorithm>

#include "common/hf_config.h"
#include "common/memory_estimate.h"
#include "common/path_policy.h"
#include "engine/train/counted_step.h"
#include "proto/spec_convert.h"

namespace meshrun::rank {

Status FillModelFromInitFrom(const v1::ModelSpec& sent, JobSpec* spec) {
  if (spec->model.init_from.empty()) return OkStatus();
  MESHRUN_ASSIGN_OR_RETURN(ModelSpec file, ReadInitFromConfig(spec->model.init_from));
  // A field is given when the message sets it (every field of ModelSpec is `optional`); its
  // name is the YAML key, "rope_scaling" standing for the rope_scaling_* fields.
  const google::protobuf::Descriptor* d = sent.GetDescriptor();
  const google::protobuf::Reflection* r = sent.GetReflection();
  auto has = [&](const std::string& name) {
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(name);
    return f != nullptr && r->HasField(sent, f);
  };
  const ModelSpec defaults;
  FillModelFromConfig(
      file,
      [&](std::string_view field) {
        if (field == "rope_scaling") return has("rope_scaling_type") || has("rope_scaling_factor");
        return has(std::string(field));
      },
      &spec->model);
  // Left out and not config.json's (seq_len of the Llama family): the spec's default, not the
  // coordinator's placeholder (proto/spec_convert.h).
  if (!sent.has_seq_len() && !spec->model.family().learned_positions)
    spec->model.seq_len = defaults.seq_len;
  return OkStatus();
}

StatusOr<JobSpec> SpecOfRankStart(const v1::RankStart& start) {
  const v1::RankAssignment& a = start.assignment();
  MESHRUN_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromProto(a.spec()));
  if (start.threads() > 0) spec.resources.threads = start.threads();
  // Confined: relative paths are joined to the roots the worker gave (as its check did); what
  // each path opens is checked again at the open (common/confined_file.h).
  if (start.has_file_roots()) {
    const v1::RankFileRoots& r = start.file_roots();
    MESHRUN_ASSIGN_OR_RETURN(PathPolicy paths,
                             PathPolicy::Create({r.data().begin(), r.data().end()},
                                                {r.checkpoint().begin(), r.checkpoint().end()}));
    MESHRUN_RETURN_IF_ERROR(paths.ConfineJobSpec(&spec, PathPolicy::Rewrite::kAbsolute));
  }
  MESHRUN_RETURN_IF_ERROR(FillModelFromInitFrom(a.spec().model(), &spec));
  MESHRUN_RETURN_IF_ERROR(ValidateJobSpec(spec, a.world_size()));
  // The worker counted this rank's step before starting it when the sizes were in the spec
  // (ModelSizesSent); with sizes read from init_from only the rank knows them, so then it counts
  // its own step here, before anything is allocated.
  if (start.memory_bytes() > 0 && spec.resources.device == "cpu" && !ModelSizesSent(a.spec())) {
    MESHRUN_ASSIGN_OR_RETURN(ParallelDims mesh, MeshOf(spec));
    // This rank's own step, counted on the counting device (engine/train/counted_step.h).
    MESHRUN_ASSIGN_OR_RETURN(const double rank_bytes, CountedRankBytes(spec, a.rank()));
    MESHRUN_RETURN_IF_ERROR(CheckRankMemory(spec, mesh, std::max(1, a.local_world_size()),
                                            static_cast<double>(start.memory_bytes()),
                                            "--memory-bytes", rank_bytes));
  }
  return spec;
}

}  // namespace meshrun::rank
