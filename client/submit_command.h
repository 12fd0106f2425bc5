// `meshrun submit -f JOB.yaml [--set K=V]… [--follow] [-o json]`: validates the spec here (exit
// 2 with the one-line error), sends it to the coordinator and prints the job id; --follow then
// shows the job's progress until it ends (exit 0 only when it SUCCEEDED).
#pragma once

#include <string>
#include <vector>

#include "client/command.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "meshrun/v1/job_spec.pb.h"

namespace CLI {
class App;
}  // namespace CLI

namespace meshrun::client {

void RegisterSubmitCommand(CLI::App& app, CommandResult& result);

// The spec of a file with its overrides, validated and ready to send: relative paths (data,
// checkpoint.dir, model.init_from) made absolute against the current folder, since the ranks
// run elsewhere; source_yaml and set_overrides filled. INVALID_ARGUMENT for a bad spec, and
// with `local_checks` for what CheckBeforeTraining (preflight.h) finds on this host.
StatusOr<v1::JobSpec> PrepareSubmission(const std::string& file,
                                        const std::vector<std::string>& overrides,
                                        bool local_checks = true);

// A fresh idempotency key for SubmitJob (128 random bits in hex).
std::string NewRequestId();

}  // namespace meshrun::client
