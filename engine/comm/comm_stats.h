// Communication accounting: the collective ops, their "bus bytes" (docs/parallelism.md) and a
// thread-safe per-(axis, op) counter of seconds, bus bytes and calls, shared by every
// Communicator of a rank and read by the trainer's metrics (docs/metrics.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

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

// Totals of one (axis, op) series.
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

// Per-rank counters keyed by (axis label, op name). Thread-safe: every communicator of a rank
// records into one shared instance while the trainer reads snapshots from another thread.
class CommStats {
 public:
  using Key = std::pair<std::string, std::string>;  // (axis, op)

  // One call of `seconds`, of which `exposed_seconds` (< 0: all of them) blocked the caller.
  void Record(std::string_view axis, std::string_view op, double seconds, double bytes,
              double exposed_seconds = -1);
  void Record(std::string_view axis, CommOp op, double seconds, double bytes,
              double exposed_seconds = -1) {
    Record(axis, CommOpName(op), seconds, bytes, exposed_seconds);
  }

  // A consistent copy of every series recorded so far.
  std::map<Key, CommCounter> Snapshot() const;
  // The sum over ops of one axis (zeros when nothing was recorded under it).
  CommCounter AxisTotal(std::string_view axis) const;
  // One series (zeros when absent).
  CommCounter Get(std::string_view axis, std::string_view op) const;
  void Reset();

 private:
  mutable std::mutex mu_;
  std::map<Key, CommCounter> counters_;
};

}  // namespace meshrun
