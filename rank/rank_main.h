// The rank: one process of a job's mesh. Its whole input is one RankStart
// (proto/meshrun/v1/rank.proto) — produced by meshrun-worker or by the standalone launcher of
// `meshrun train --nproc N` — and it reports to its supervisor in RankReport messages. The spec
// arrives once, as the proto JobSpec, and is validated once here.
#pragma once

#include "meshrun/v1/rank.pb.h"
#include "rank/rank_reports.h"

namespace meshrun::rank {

struct RankRunOptions {
  // A rank of its own in the foreground (`meshrun train` with one rank): Ctrl-C says what
  // happens next, and the notes of a run that trained nothing new are printed.
  bool interactive = false;
};

// Trains as `start` says, reporting to `sink`; logs go to sink->Log (stderr). Returns the exit
// code: 0, 130 after a stop request, 2 for invalid input, 1 for anything else (one `error:`
// line on stderr).
int RunRank(const v1::RankStart& start, ReportSink* sink, const RankRunOptions& options = {});

// The worker's roots (RankStart.file_roots, from its --data-root and --checkpoint-root) as this
// process's confinement (common/confined_file.h); nothing when the start has none. RunRank calls
// it before anything is opened.
void InstallRankFileRoots(const v1::RankStart& start);

// `meshrun __rank`: reads the RankStart on stdin and reports on fd 3.
int RankMain();

}  // namespace meshrun::rank
