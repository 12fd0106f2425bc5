// The rank's typed reports (proto/meshrun/v1/rank.proto): built from what the trainer reports
// and sent to whoever supervises the rank — framed on fd 3 for a worker or the standalone
// launcher, or straight to a printer when `meshrun train` runs its one rank in-process.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "engine/comm/comm_stats.h"
#include "engine/train/trainer.h"
#include "meshrun/v1/rank.pb.h"

namespace meshrun::rank {

// The wire forms of an op and a charge (engine/comm/comm_stats.h) in RankCommCounter, and back:
// nullopt for a value this build lacks.
v1::CommOp CommOpToProto(CommOp op);
std::optional<CommOp> CommOpFromProto(v1::CommOp op);
void SetCharge(CommCharge charge, v1::RankCommCounter* out);
std::optional<CommCharge> ChargeOf(const v1::RankCommCounter& c);

v1::RankMemory MemoryReport(const MemoryBreakdown& memory);
v1::RankStep StepReport(const StepMetrics& m);
v1::RankSummary SummaryReport(const RunSummary& s);

// The lines of `train -o json` (docs/cli.md shapes), without their newline: step k (loss, lr,
// grad_norm, timings, memory and "comm":[{"axis","op","seconds","bytes","calls"}], cumulative
// since the rank's first step), eval, and the summary.
std::string StepLineJson(const v1::RankStep& step);
std::string EvalLineJson(const v1::RankEval& eval);
std::string SummaryLineJson(const v1::RankSummary& summary);

// Where a rank's reports and log lines go. Called from the rank's main thread only.
class ReportSink {
 public:
  virtual ~ReportSink() = default;
  virtual void Report(const v1::RankReport& report) = 0;
  // A line for people (stderr by default).
  virtual void Log(const std::string& line);
};

// Writes each report as one frame (supervisor/line_splitter.h) to a file descriptor: the
// report channel, fd 3 of a supervised rank. A write error ends reporting, not the rank.
class FdReportSink final : public ReportSink {
 public:
  explicit FdReportSink(int fd) : fd_(fd) {}
  void Report(const v1::RankReport& report) override;

 private:
  int fd_;
};

// The one RankStart frame on `fd` (the rank's stdin). INVALID_ARGUMENT when it is missing or
// does not parse.
StatusOr<v1::RankStart> ReadRankStart(int fd);

}  // namespace meshrun::rank
