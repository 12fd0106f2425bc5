// The rank's typed reports (see rank_reports.h).
#include "rank/rank_reports.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "proto/mesh_axis.h"
#include "supervisor/line_splitter.h"

namespace meshrun::rank {

v1::CommOp CommOpToProto(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce: return v1::COMM_OP_ALL_REDUCE;
    case CommOp::kReduceScatter: return v1::COMM_OP_REDUCE_SCATTER;
    case CommOp::kAllGather: return v1::COMM_OP_ALL_GATHER;
    case CommOp::kBroadcast: return v1::COMM_OP_BROADCAST;
    case CommOp::kSend: return v1::COMM_OP_SEND;
    case CommOp::kRecv: return v1::COMM_OP_RECV;
    case CommOp::kSendRecv: return v1::COMM_OP_SEND_RECV;
    case CommOp::kBarrier: return v1::COMM_OP_BARRIER;
  }
  return v1::COMM_OP_UNSPECIFIED;
}

std::optional<CommOp> CommOpFromProto(v1::CommOp op) {
  switch (op) {
    case v1::COMM_OP_ALL_REDUCE: return CommOp::kAllReduce;
    case v1::COMM_OP_REDUCE_SCATTER: return CommOp::kReduceScatter;
    case v1::COMM_OP_ALL_GATHER: return CommOp::kAllGather;
    case v1::COMM_OP_BROADCAST: return CommOp::kBroadcast;
    case v1::COMM_OP_SEND: return CommOp::kSend;
    case v1::COMM_OP_RECV: return CommOp::kRecv;
    case v1::COMM_OP_SEND_RECV: return CommOp::kSendRecv;
    case v1::COMM_OP_BARRIER: return CommOp::kBarrier;
    default: return std::nullopt;
  }
}

void SetCharge(CommCharge charge, v1::RankCommCounter* out) {
  switch (charge.kind) {
    case CommKind::kAxis:
      out->set_kind(v1::COMM_KIND_AXIS);
      out->set_axis(MeshAxisToProto(charge.axis));
      return;
    case CommKind::kMetrics: out->set_kind(v1::COMM_KIND_METRICS); return;
    case CommKind::kControl: out->set_kind(v1::COMM_KIND_CONTROL); return;
  }
}

std::optional<CommCharge> ChargeOf(const v1::RankCommCounter& c) {
  switch (c.kind()) {
    case v1::COMM_KIND_AXIS: {
      const std::optional<MeshAxis> axis = MeshAxisFromProto(c.axis());
      if (!axis) return std::nullopt;
      return CommCharge::Axis(*axis);
    }
    case v1::COMM_KIND_METRICS: return CommCharge::Metrics();
    case v1::COMM_KIND_CONTROL: return CommCharge::Control();
    default: return std::nullopt;
  }
}

v1::RankMemory MemoryReport(const MemoryBreakdown& m) {
  v1::RankMemory out;
  out.set_parameters(m.peak[static_cast<int>(MemoryKind::kParameters)]);
  out.set_gradients(m.peak[static_cast<int>(MemoryKind::kGradients)]);
  out.set_optimizer(m.peak[static_cast<int>(MemoryKind::kOptimizer)]);
  out.set_activations(m.peak[static_cast<int>(MemoryKind::kActivations)]);
  out.set_communication(m.peak[static_cast<int>(MemoryKind::kCommunication)]);
  out.set_other(m.peak[static_cast<int>(MemoryKind::kOther)]);
  return out;
}

v1::RankStep StepReport(const StepMetrics& m) {
  v1::RankStep r;
  r.set_step(m.step);
  r.set_loss(m.loss);
  r.set_lr(m.lr);
  r.set_grad_norm(m.grad_norm);
  r.set_step_seconds(m.step_seconds);
  r.set_tokens_per_second(m.tokens_per_second);
  r.set_tflops(m.tflops);
  r.set_mfu(m.mfu);
  r.set_allocated_memory_bytes(m.allocated_memory_bytes);
  r.set_peak_memory_bytes(m.peak_memory_bytes);
  r.set_reserved_memory_bytes(m.reserved_memory_bytes);
  // Measured only under pipeline parallelism (the trainer leaves it 0 without pp).
  if (m.pipeline_bubble_ratio > 0) {
    r.set_pipeline_bubble_ratio(std::min(1.0, m.pipeline_bubble_ratio));
  }
  if (m.pipeline_bubble_theory > 0) r.set_pipeline_bubble_theory(m.pipeline_bubble_theory);
  *r.mutable_memory() = MemoryReport(m.memory);
  for (const auto& [key, c] : m.comm) {
    v1::RankCommCounter* out = r.add_comm();
    SetCharge(key.first, out);
    out->set_op(CommOpToProto(key.second));
    out->set_seconds(c.seconds);
    out->set_bytes(c.bytes);
    out->set_calls(c.calls);
    out->set_overlapped_seconds(c.overlapped_seconds());
  }
  return r;
}

v1::RankSummary SummaryReport(const RunSummary& s) {
  v1::RankSummary r;
  r.set_steps(s.steps);
  if (!std::isnan(s.final_loss)) r.set_final_loss(s.final_loss);
  for (double loss : s.losses) r.add_losses(loss);
  r.set_tokens_per_second(s.tokens_per_second);
  r.set_mfu(s.mfu);
  r.set_peak_memory_bytes(s.peak_memory_bytes);
  *r.mutable_memory() = MemoryReport(s.memory);
  r.set_max_rss_bytes(s.max_rss_bytes);
  // The mesh's own axes in their order (proto/mesh_axis.h), those the run reports.
  for (MeshAxis axis : kMeshOwnAxes) {
    auto it = s.comm_bytes.find(axis);
    if (it == s.comm_bytes.end()) continue;
    v1::AxisBytes* a = r.add_comm_bytes();
    a->set_axis(MeshAxisToProto(axis));
    a->set_bytes(it->second);
  }
  r.set_checkpoint(s.last_checkpoint);
  r.set_resumed_from_step(s.resumed_step);
  r.set_last_step(s.last_step);
  r.set_interrupted(s.interrupted);
  return r;
}

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
    const std::optional<CommCharge> charge = ChargeOf(c);
    const std::optional<CommOp> op = CommOpFromProto(c.op());
    if (!charge || !op) continue;  // a value this build cannot name
    comm.push_back({{"axis", CommChargeLabel(*charge)},
                    {"op", CommOpName(*op)},
                    {"seconds", c.seconds()},
                    {"exposed_seconds", std::max(0.0, c.seconds() - c.overlapped_seconds())},
                    {"overlapped_seconds", c.overlapped_seconds()},
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
  if (m.has_pipeline_bubble_ratio()) line["pipeline_bubble_ratio"] = m.pipeline_bubble_ratio();
  if (m.has_pipeline_bubble_theory()) line["pipeline_bubble_theory"] = m.pipeline_bubble_theory();
  return line.dump();
}

std::string EvalLineJson(const v1::RankEval& e) {
  const json line = {
      {"event", "eval"}, {"step", e.step()}, {"loss", e.loss()}, {"tokens", e.tokens()}};
  return line.dump();
}

std::string SummaryLineJson(const v1::RankSummary& s) {
  json comm = json::object();
  for (const v1::AxisBytes& a : s.comm_bytes()) {
    const std::optional<MeshAxis> axis = MeshAxisFromProto(a.axis());
    if (axis) comm[std::string(MeshAxisName(*axis))] = a.bytes();
  }
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

void ReportSink::Log(const std::string& line) {
  std::cerr << line << std::endl;
}

void FdReportSink::Report(const v1::RankReport& report) {
  if (fd_ < 0) return;
  const std::string frame = Frame(report.SerializeAsString());
  std::string_view rest = frame;
  while (!rest.empty()) {
    const ssize_t n = write(fd_, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fd_ = -1;  // the supervisor went away; it stops us too
      return;
    }
    rest.remove_prefix(static_cast<size_t>(n));
  }
}

StatusOr<v1::RankStart> ReadRankStart(int fd) {
  std::string data;
  char buffer[65536];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  std::optional<std::string> payload;
  FrameSplitter frames;
  frames.Feed(data, [&](std::string frame) {
    if (!payload) payload = std::move(frame);
  });
  v1::RankStart start;
  if (!payload || !start.ParseFromString(*payload)) {
    return InvalidArgumentError(
        "stdin: no RankStart message (" + std::to_string(data.size()) +
        " bytes) (hint: `meshrun __rank` is started by meshrun-worker or `meshrun train --nproc "
        "N`, which write its assignment to its stdin)");
  }
  return start;
}

}  // namespace meshrun::rank
