// Bus-byte formulas, charge labels and the per-(charge, op) counters of comm_stats.h.
#include "engine/comm/comm_stats.h"

namespace meshrun {

const char* CommOpName(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce: return "all_reduce";
    case CommOp::kReduceScatter: return "reduce_scatter";
    case CommOp::kAllGather: return "all_gather";
    case CommOp::kBroadcast: return "broadcast";
    case CommOp::kSend: return "send";
    case CommOp::kRecv: return "recv";
    case CommOp::kSendRecv: return "send_recv";
    case CommOp::kBarrier: return "barrier";
  }
  return "unknown";
}

const char* CommChargeLabel(CommCharge charge) {
  switch (charge.kind) {
    case CommKind::kAxis: return MeshAxisName(charge.axis);
    case CommKind::kMetrics: return "metrics";
    case CommKind::kControl: return "control";
  }
  return "unknown";
}

double BusBytes(CommOp op, size_t bytes, int n) {
  if (n <= 1) return 0;
  const double s = static_cast<double>(bytes);
  const double frac = static_cast<double>(n - 1) / n;
  switch (op) {
    case CommOp::kAllReduce: return s * 2 * frac;
    case CommOp::kReduceScatter:
    case CommOp::kAllGather:
    case CommOp::kBroadcast: return s * frac;
    case CommOp::kSend:
    case CommOp::kSendRecv: return s;
    case CommOp::kRecv:
    case CommOp::kBarrier: return 0;
  }
  return 0;
}

void CommStats::Record(CommCharge charge, CommOp op, double seconds, double bytes,
                       double exposed_seconds) {
  if (exposed_seconds < 0 || exposed_seconds > seconds) exposed_seconds = seconds;
  if (charge.kind != CommKind::kAxis) charge.axis = CommCharge{}.axis;  // one series per kind
  std::lock_guard<std::mutex> lock(mu_);
  CommCounter& c = counters_[Key(charge, op)];
  c.seconds += seconds;
  c.exposed_seconds += exposed_seconds;
  c.bytes += bytes;
  c.calls += 1;
}

std::map<CommStats::Key, CommCounter> CommStats::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

CommCounter CommStats::AxisTotal(MeshAxis axis) const {
  std::lock_guard<std::mutex> lock(mu_);
  CommCounter total;
  for (const auto& [key, counter] : counters_) {
    if (key.first == CommCharge::Axis(axis)) total += counter;
  }
  return total;
}

CommCounter CommStats::Get(CommCharge charge, CommOp op) const {
  if (charge.kind != CommKind::kAxis) charge.axis = CommCharge{}.axis;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counters_.find(Key(charge, op));
  return it == counters_.end() ? CommCounter{} : it->second;
}

void CommStats::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.clear();
}

}  // namespace meshrun
