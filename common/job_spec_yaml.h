// Reads and writes the job spec (docs/job-spec.md) as YAML with yaml-cpp, applying `--set`
// overrides. Nothing here throws: every yaml-cpp exception becomes an INVALID_ARGUMENT Status
// whose message names the field path and, where there is one, the YAML line.
#pragma once

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"

namespace meshrun {

// Parses `text`, applies `overrides` (each "dotted.path=value", the value read as a YAML
// scalar or flow collection, applied to the tree before conversion) and validates the result
// with ValidateJobSpec(spec, /*nproc=*/0). `source` names the text in messages about malformed
// YAML: `<source>: malformed YAML at line N: ...`.
//
// Other errors: unknown fields (with a did-you-mean hint), duplicate fields, wrong types,
// out-of-range values and a missing data.train, e.g.
//   parallelism.tp_sz: unknown field (line 4) (hint: did you mean 'tp_size'?)
//   train.steps: expected an integer, got 'ten' (line 7) (hint: write a whole number, ...)
//   --set parallelism.tp_sz: unknown field (hint: did you mean 'tp_size'?)
StatusOr<JobSpec> ParseJobSpecYaml(const std::string& text,
                                   const std::vector<std::string>& overrides,
                                   const std::string& source = "<job spec>");

// Reads the file at `path` and parses it as ParseJobSpecYaml does (source = path). With
// model.init_from set, model fields the file and overrides leave out are taken from the
// folder's config.json (docs/job-spec.md); this is the one reader that touches other files. A file
// that cannot be read is INVALID_ARGUMENT too: it is the caller's input.
StatusOr<JobSpec> LoadJobSpecFile(const std::string& path,
                                  const std::vector<std::string>& overrides);

// Every field, in spec order, in block style. For a valid spec,
// ParseJobSpecYaml(JobSpecToYaml(spec), {}) returns a spec equal to `spec`.
std::string JobSpecToYaml(const JobSpec& spec);

}  // namespace meshrun
