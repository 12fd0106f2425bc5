// What `meshrun train` prints of a rank's RankReport messages (proto/meshrun/v1/rank.proto):
// JSON objects, one a line, on stdout with -o json (and nothing else there; docs/cli.md
// shapes), otherwise the progress bar (a terminal) or lines (not one) and the summary line that
// `submit --follow` shows (client/progress.h). The same printer serves the in-process rank of
// `train` and rank 0 of `train --nproc N` (its reports arrive through the launcher).
#pragma once

#include <cstdint>
#include <string>

#include "client/progress.h"
#include "meshrun/v1/rank.pb.h"
#include "rank/rank_reports.h"

namespace meshrun::client {

// Not thread-safe: one thread reports at a time (the rank's, or the launcher's supervisor).
class ReportPrinter final : public rank::ReportSink {
 public:
  // terminal: text on a terminal redraws one progress bar (the one `submit --follow` shows)
  // instead of printing a line per step.
  ReportPrinter(bool json_output, int64_t steps, bool terminal);
  ~ReportPrinter() override;

  void Report(const v1::RankReport& report) override;
  void Log(const std::string& line) override;
  // Clears the bar before someone else writes a line (the launcher, for the ranks' output);
  // the next step draws it again.
  void BeforeLine();

 private:
  void OnStep(const v1::RankStep& m);
  void OnEval(const v1::RankEval& e);
  void OnSummary(const v1::RankSummary& s);
  // Leaves the bar's last state on its own line.
  void EndBar();
  // Clears the bar's line for another line; the next step draws the bar again.
  void ClearBar();

  bool json_;
  int64_t steps_;
  bool terminal_;
  ProgressState bar_;
  bool bar_shown_ = false;
};

}  // namespace meshrun::client
