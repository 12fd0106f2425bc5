// What `meshrun train` prints of a rank's reports (see report_printer.h).
#include "client/report_printer.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

namespace meshrun::client {
namespace {

using json = nlohmann::ordered_json;

// Peak bytes per kind, as the step line and summary carry them.
json MemoryJson(const v1::RankMemory& m) {
  return {{"parameters", m.parameters()},       {"gradients", m.gradients()},
          {"optimizer", m.optimizer()},         {"activations", m.activations()},
          {"communication", m.communication()}, {"other", m.other()}};
}

}  // namespace

std::string StepLineJson(const v1::RankStep& m) {
  json comm = json::array();
  for (const v1::RankCommCounter& c : m.comm()) {
    comm.push_back({{"axis", c.axis()},
                    {"op", c.op()},
                    {"seconds", c.seconds()},
                    {"bytes", c.bytes()},
                    {"calls", c.calls()}});
  }
  json line = {{"event", "step"},
               {"step", m.step()},
               {"loss", m.loss()},
               {"lr", m.lr()},
               {"grad_norm", m.grad_norm()},
               {"step_seconds", m.step_seconds()},
               {"tokens_per_second", m.tokens_per_second()},
               {"tflops", m.tflops()},
               {"mfu", m.mfu()},
               {"allocated_memory_bytes", m.allocated_memory_bytes()},
               {"peak_memory_bytes", m.peak_memory_bytes()},
               {"reserved_memory_bytes", m.reserved_memory_bytes()},
               {"memory", MemoryJson(m.memory())},
               {"comm", std::move(comm)}};
  return line.dump();
}

std::string SummaryLineJson(const v1::RankSummary& s) {
  const json comm = {{"tp", s.comm_bytes_tp()},
                     {"cp", s.comm_bytes_cp()},
                     {"dp_shard", s.comm_bytes_dp_shard()},
                     {"dp_replicate", s.comm_bytes_dp_replicate()}};
  json losses = json::array();
  for (double loss : s.losses()) losses.push_back(loss);
  json line = {{"event", "summary"},
               {"steps", s.steps()},
               {"final_loss", s.has_final_loss() ? json(s.final_loss()) : json(nullptr)},
               {"losses", std::move(losses)},
               {"tokens_per_second", s.tokens_per_second()},
               {"mfu", s.mfu()},
               {"peak_memory_bytes", s.peak_memory_bytes()},
               {"memory", MemoryJson(s.memory())},
               {"max_rss_bytes", s.max_rss_bytes()},
               {"comm_bytes", comm},
               {"checkpoint", s.checkpoint()},
               {"resumed_from_step", s.resumed_from_step()},
               {"last_step", s.last_step()},
               {"interrupted", s.interrupted()}};
  return line.dump();
}

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
    std::cout << StepLineJson(m) << std::endl;
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
    json line = {{"event", "eval"}, {"step", e.step()}, {"loss", e.loss()}, {"tokens", e.tokens()}};
    std::cout << line.dump() << std::endl;
  } else {
    std::printf("eval  step %lld  val loss %.4f over %lld tokens\n",
                static_cast<long long>(e.step()), e.loss(), static_cast<long long>(e.tokens()));
    std::fflush(stdout);
  }
}

void ReportPrinter::OnSummary(const v1::RankSummary& s) {
  EndBar();
  if (json_) {
    std::cout << SummaryLineJson(s) << std::endl;
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
