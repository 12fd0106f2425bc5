// Communication accounting: the collective ops, their "bus bytes" (docs/parallelism.md), what a
// call's traffic is charged to (a mesh axis, or the trainer's own bookkeeping), and a thread-safe
// per-(charge, op) counter of seconds, bus bytes and calls, shared by every Communicator of a
// rank and read by the trainer's metrics (docs/metrics.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "common/parallel_dims.h"

namespace meshrun {

enum class CommOp {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kSendRecv,
  kBarrier,
};

// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "send_recv",
// "barrier": the `op` label of meshrun_rank_comm_*_total.
const char* CommOpName(CommOp op);

// Bus bytes of one call on one rank of an n-rank group, as nccl-tests counts them, whatever
// algorithm the backend runs. `bytes` is S:
//   all_reduce      S = the buffer            -> S·2(n−1)/n
//   reduce_scatter  S = the input (n·count)   -> S·(n−1)/n
//   all_gather      S = the output (n·count)  -> S·(n−1)/n
//   broadcast       S = the buffer            -> S·(n−1)/n  (nccl-tests counts S; we count what
//                                                 a pipelined ring moves per rank on average)
//   send, send_recv S = the bytes sent        -> S
//   recv, barrier                             -> 0 (the sender counts the transfer)
// n = 1 moves nothing: 0 for every op.
double BusBytes(CommOp op, size_t bytes, int n);

// Why a call moved bytes (docs/decisions/0028). Parallelism traffic is charged to the mesh axis
// whose parallelism caused it; the trainer's own reductions serve no parallelism and are counted
// apart, under their kind, whatever group they run over.
enum class CommKind {
  kAxis,     // a mesh axis's parallelism: tp's reductions, cp's K/V exchange, FSDP, replicas
  kMetrics,  // reporting: the step's loss, the summary's averages and maxima
  kControl,  // the stop agreement at a step boundary
};

// What one call is charged to: CommCharge::Axis(MeshAxis::kDpShard), CommCharge::Metrics() or
// CommCharge::Control(). `axis` is meaningful only for kAxis (the others keep the default, so
// that all metrics traffic is one series whichever group carried it).
struct CommCharge {
  CommKind kind = CommKind::kAxis;
  MeshAxis axis = MeshAxis::kDpReplicate;

  static constexpr CommCharge Axis(MeshAxis a) { return {CommKind::kAxis, a}; }
  static constexpr CommCharge Metrics() { return {CommKind::kMetrics, MeshAxis::kDpReplicate}; }
  static constexpr CommCharge Control() { return {CommKind::kControl, MeshAxis::kDpReplicate}; }
  friend constexpr auto operator<=>(const CommCharge&, const CommCharge&) = default;
};

// The one spelling of a charge, the `axis` of the step line's `comm` entries (docs/cli.md):
// MeshAxisName of the axis ("dp_shard"), or "metrics" / "control".
const char* CommChargeLabel(CommCharge charge);

// Totals of one (charge, op) series.
struct CommCounter {
  double seconds = 0;  // from the call's start to its completion
  double bytes = 0;    // bus bytes; fractional because S·(n−1)/n need not be an integer
  uint64_t calls = 0;
  // The part of `seconds` the caller was blocked for (all of it for blocking calls and on CPU
  // backends); the rest overlapped with the caller's compute (communicator.h, Start/Wait).
  double exposed_seconds = 0;

  double overlapped_seconds() const {
    return seconds > exposed_seconds ? seconds - exposed_seconds : 0;
  }

  CommCounter& operator+=(const CommCounter& o) {
    seconds += o.seconds;
    bytes += o.bytes;
    calls += o.calls;
    exposed_seconds += o.exposed_seconds;
    return *this;
  }
};

// Per-rank counters keyed by (charge, op). Thread-safe: every communicator of a rank records
// into one shared instance while the trainer reads snapshots from another thread.
class CommStats {
 public:
  using Key = std::pair<CommCharge, CommOp>;

  // One call of `seconds`, of which `exposed_seconds` (< 0: all of them) blocked the caller.
  void Record(CommCharge charge, CommOp op, double seconds, double bytes,
              double exposed_seconds = -1);

  // A consistent copy of every series recorded so far.
  std::map<Key, CommCounter> Snapshot() const;
  // The sum over ops of one axis's parallelism traffic (zeros when nothing was recorded).
  CommCounter AxisTotal(MeshAxis axis) const;
  // One series (zeros when absent).
  CommCounter Get(CommCharge charge, CommOp op) const;
  CommCounter Get(MeshAxis axis, CommOp op) const { return Get(CommCharge::Axis(axis), op); }
  void Reset();

 private:
  mutable std::mutex mu_;
  std::map<Key, CommCounter> counters_;
};

}  // namespace meshrun
