// The bus bytes (docs/parallelism.md) each mesh axis moves per rank per training step, from the
// formulas of docs/parallelism.md. The trainer measures the same quantity from the calls it
// makes (CommStats); tests/integration/parallel_test.cc asserts they agree.
#pragma once

#include <map>
#include <string>

#include "common/job_spec.h"

namespace meshrun {

// Keys "tp", "cp", "dp_shard", "dp_replicate". The spec must be valid.
std::map<std::string, double> ExpectedCommBytesPerStep(const JobSpec& spec);

}  // namespace meshrun
