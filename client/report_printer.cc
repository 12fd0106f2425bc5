// What `meshrun train` prints of a rank's reports (see report_printer.h).
#include "client/report_printer.h"

#include <cmath>
#include <cstdio>
#include <iostream>

#include "common/escape.h"

namespace meshrun::client {
ReportPrinter::ReportPrinter(bool json_output, int64_t steps, bool terminal)
    : json_(json_output), steps_(steps), terminal_(terminal && !json_output) {
  bar_.steps = steps;
  bar_.state = v1::JOB_STATE_RUNNING;
}

ReportPrinter::~ReportPrinter() {
  EndBar();
}

void ReportPrinter::Report(const v1::RankReport& report) {
  switch (report.report_case()) {
    case v1::RankReport::kStep: OnStep(report.step()); break;
    case v1::RankReport::kEval: OnEval(report.eval()); break;
    case v1::RankReport::kSummary: OnSummary(report.summary()); break;
    default:  // checkpoint_saved: its log line already says it
      break;
  }
}

void ReportPrinter::OnStep(const v1::RankStep& m) {
  if (json_) {
    std::cout << rank::StepLineJson(m) << std::endl;
    return;
  }
  // The state `submit --follow` keeps of a job, so both draw the same bar and lines.
  bar_.Observe(m);
  if (terminal_) {
    std::cout << "\r\x1b[K" << RenderProgressLine(bar_, 24) << std::flush;
    bar_shown_ = true;
  } else {
    std::cout << RenderProgressLine(bar_, 0) << std::endl;
  }
}

void ReportPrinter::OnEval(const v1::RankEval& e) {
  ClearBar();
  if (json_) {
    std::cout << rank::EvalLineJson(e) << std::endl;
  } else {
    std::printf("eval  step %lld  val loss %.4f over %lld tokens\n",
                static_cast<long long>(e.step()), e.loss(), static_cast<long long>(e.tokens()));
    std::fflush(stdout);
  }
}

void ReportPrinter::OnSummary(const v1::RankSummary& s) {
  EndBar();
  if (json_) {
    std::cout << rank::SummaryLineJson(s) << std::endl;
  } else if (s.steps() > 0) {
    // The totals `submit --follow` ends with, after "done:" (or "stopped:" on an interrupt).
    RunTotals totals;
    totals.last_step = s.last_step();
    totals.steps = steps_;
    totals.final_loss = s.has_final_loss() ? s.final_loss() : std::nan("");
    totals.tokens_per_second = s.tokens_per_second();
    totals.mfu = s.mfu();
    std::string line = (s.interrupted() ? "stopped: " : "done: ") + RenderRunTotals(totals);
    if (s.resumed_from_step() > 0) {
      line += " (resumed from step " + std::to_string(s.resumed_from_step()) + ")";
    }
    if (!s.checkpoint().empty()) line += ", checkpoint " + EscapeText(s.checkpoint());
    std::cout << line << std::endl;
  }
}

void ReportPrinter::Log(const std::string& line) {
  ClearBar();
  std::cerr << line << std::endl;
}

void ReportPrinter::BeforeLine() {
  ClearBar();
}

void ReportPrinter::EndBar() {
  if (bar_shown_) std::cout << std::endl;
  bar_shown_ = false;
}

void ReportPrinter::ClearBar() {
  if (bar_shown_) std::cout << "\r\x1b[K" << std::flush;
}

}  // namespace meshrun::client
