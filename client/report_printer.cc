// What `meshrun train` prints of a rank's reports (see report_printer.h).
#include "client/report_printer.h"

#include <cmath>
#include <cstdio>
#include <iostream>

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
  } else if (terminal_) {
    bar_.step = m.step();
    bar_.loss = m.loss();
    bar_.tokens_per_second = m.tokens_per_second();
    bar_.mfu = m.mfu();
    bar_.step_seconds =
        bar_.step_seconds > 0 ? 0.8 * bar_.step_seconds + 0.2 * m.step_seconds() : m.step_seconds();
    std::cout << "\r\x1b[K" << RenderProgressLine(bar_, 24) << std::flush;
    bar_shown_ = true;
  } else {
    std::printf(
        "step %5lld/%-5lld loss %.4f  lr %.3e  norm %.3f  %7.1f ms  %9.0f tok/s  "
        "%.4f TFLOP/s  MFU %5.1f%%  peak %.1f MiB\n",
        static_cast<long long>(m.step()), static_cast<long long>(steps_), m.loss(), m.lr(),
        m.grad_norm(), m.step_seconds() * 1e3, m.tokens_per_second(), m.tflops(), 100.0 * m.mfu(),
        static_cast<double>(m.peak_memory_bytes()) / (1 << 20));
    std::fflush(stdout);
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
    std::printf("%s: %lld steps, final loss %.4f (first %.4f), %.0f tok/s, MFU %.1f%%%s%s\n",
                s.interrupted() ? "stopped" : "done", static_cast<long long>(s.steps()),
                s.has_final_loss() ? s.final_loss() : std::nan(""),
                s.losses().empty() ? std::nan("") : s.losses(0), s.tokens_per_second(),
                100.0 * s.mfu(), s.checkpoint().empty() ? "" : ", checkpoint ",
                s.checkpoint().c_str());
    std::fflush(stdout);
  }
}

void ReportPrinter::Log(const std::string& line) {
  ClearBar();
  std::cerr << line << std::endl;
}

void ReportPrinter::EndBar() {
  if (bar_shown_) std::cout << std::endl;
  bar_shown_ = false;
}

void ReportPrinter::ClearBar() {
  if (bar_shown_) std::cout << "\r\x1b[K" << std::flush;
}

}  // namespace meshrun::client
