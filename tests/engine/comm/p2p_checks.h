// The asynchronous point-to-point contract (Communicator::StartSend / StartRecv, decision 0064)
// as one check both backends' tests run on a 2-rank group: receives posted ahead and completed
// out of order, messages matched in posting order with the blocking calls in between, sends and
// receives in flight both ways at once, and their counting.
#pragma once

#include <string>
#include <vector>

#include "engine/comm/communicator.h"

namespace meshrun::testing {

// Element i of message k that rank r sends.
inline float P2PValue(int r, int k, size_t i) {
  return static_cast<float>(1000 * r + 100 * k) + static_cast<float>(i);
}

// Runs on both ranks of a 2-rank group counting into `stats` (may be null); "" when every
// check held, else what failed.
inline std::string CheckAsyncP2P(Communicator& c, const CommStats* stats) {
  const int r = c.rank(), peer = 1 - r;
  constexpr size_t kCount = 3000;
  constexpr int kAhead = 3;
  auto fail = [&](const std::string& what) { return "rank " + std::to_string(r) + ": " + what; };
  auto message = [&](int from, int k) {
    std::vector<float> m(kCount);
    for (size_t i = 0; i < kCount; ++i) m[i] = P2PValue(from, k, i);
    return m;
  };
  auto check = [&](const std::vector<float>& got, int from, int k) -> std::string {
    for (size_t i = 0; i < kCount; ++i) {
      if (got[i] != P2PValue(from, k, i)) {
        return "message " + std::to_string(k) + " element " + std::to_string(i) + " is " +
               std::to_string(got[i]);
      }
    }
    return "";
  };
  // 1. Both ranks post kAhead receives first, then their kAhead sends, and wait for the
  // receives in the order 2, 0, 1 before the sends in reverse.
  std::vector<std::vector<float>> in(kAhead, std::vector<float>(kCount, -1.f)), out;
  std::vector<CommWork> recvs, sends;
  for (int k = 0; k < kAhead; ++k) {
    auto w = c.StartRecv(in[k].data(), kCount, peer);
    if (!w.ok()) return fail("StartRecv: " + w.status().ToString());
    if (!w->pending()) return fail("a started receive is not pending");
    recvs.push_back(std::move(w).value());
  }
  for (int k = 0; k < kAhead; ++k) out.push_back(message(r, k));
  for (int k = 0; k < kAhead; ++k) {
    auto w = c.StartSend(out[k].data(), kCount, peer);
    if (!w.ok()) return fail("StartSend: " + w.status().ToString());
    sends.push_back(std::move(w).value());
  }
  for (int k : {2, 0, 1}) {
    Status s = c.Wait(recvs[k]);
    if (!s.ok()) return fail("Wait(recv " + std::to_string(k) + "): " + s.ToString());
    if (std::string e = check(in[k], peer, k); !e.empty()) return fail(e);
  }
  for (int k = kAhead - 1; k >= 0; --k) {
    Status s = c.Wait(sends[k]);
    if (!s.ok()) return fail("Wait(send " + std::to_string(k) + "): " + s.ToString());
  }
  if (c.Wait(sends[0]).code() != StatusCode::kInvalidArgument) {
    return fail("a second Wait on one call is not INVALID_ARGUMENT");
  }
  // 2. A blocking exchange is the next message of each direction (k = kAhead).
  std::vector<float> mine = message(r, kAhead), theirs(kCount, -1.f);
  Status s = c.SendRecv(mine.data(), kCount, peer, theirs.data(), kCount, peer);
  if (!s.ok()) return fail("SendRecv: " + s.ToString());
  if (std::string e = check(theirs, peer, kAhead); !e.empty()) return fail("SendRecv " + e);
  // 3. Rank 0 sends first and receives later; rank 1 posts its receive only after a blocking
  // exchange: rank 0's send completes once the receive is posted (k = kAhead + 1, + 2).
  std::vector<float> late(kCount, -1.f), reply(kCount, -1.f);
  std::vector<float> m1 = message(r, kAhead + 1), m2 = message(r, kAhead + 2);
  if (r == 0) {
    auto send = c.StartSend(m1.data(), kCount, peer);
    if (!send.ok()) return fail(send.status().ToString());
    s = c.SendRecv(m2.data(), kCount, peer, reply.data(), kCount, peer);
    if (!s.ok()) return fail("SendRecv behind a started send: " + s.ToString());
    s = c.Wait(*send);
    if (!s.ok()) return fail("Wait(send): " + s.ToString());
    // Rank 1 sent k+1 in its SendRecv: the receive matched the first unreceived message.
    if (std::string e = check(reply, peer, kAhead + 1); !e.empty()) return fail(e);
  } else {
    auto recv = c.StartRecv(late.data(), kCount, peer);
    if (!recv.ok()) return fail(recv.status().ToString());
    s = c.SendRecv(m1.data(), kCount, peer, reply.data(), kCount, peer);
    if (!s.ok()) return fail("SendRecv behind a started receive: " + s.ToString());
    s = c.Wait(*recv);
    if (!s.ok()) return fail("Wait(recv): " + s.ToString());
    if (std::string e = check(late, peer, kAhead + 1); !e.empty()) return fail(e);
    if (std::string e = check(reply, peer, kAhead + 2); !e.empty()) return fail(e);
  }
  // 4. Zero bytes complete at once and are still waited for.
  auto none = c.StartSend(mine.data(), 0, peer);
  if (!none.ok() || !none->pending() || !c.Wait(*none).ok()) return fail("zero-sized send");
  // 5. Arguments: no self, no peer outside the group; the communicator stays usable.
  if (c.StartSend(mine.data(), kCount, r).status().code() != StatusCode::kInvalidArgument ||
      c.StartRecv(mine.data(), kCount, 2).status().code() != StatusCode::kInvalidArgument ||
      c.StartRecv(nullptr, kCount, peer).status().code() != StatusCode::kInvalidArgument) {
    return fail("bad arguments are not INVALID_ARGUMENT");
  }
  if (!c.health().ok()) return fail("bad arguments left the communicator unusable");
  // 6. Counting: the sends' bytes under the axis's send series (the blocking sends count under
  // send_recv), one call per started send; receives count no bytes.
  if (stats != nullptr) {
    const CommCounter sent = stats->Get(c.axis(), CommOp::kSend);
    const int started_sends = kAhead + (r == 0 ? 1 : 0);
    if (sent.calls != static_cast<uint64_t>(started_sends) ||
        sent.bytes != static_cast<double>(started_sends * kCount * sizeof(float))) {
      return fail("send counted " + std::to_string(sent.calls) + " calls, " +
                  std::to_string(sent.bytes) + " bytes");
    }
    const CommCounter got = stats->Get(c.axis(), CommOp::kRecv);
    if (got.calls != static_cast<uint64_t>(kAhead + (r == 1 ? 1 : 0)) || got.bytes != 0) {
      return fail("recv counted " + std::to_string(got.calls) + " calls");
    }
    if (sent.exposed_seconds > sent.seconds + 1e-9) return fail("exposed > seconds");
  }
  return "";
}

}  // namespace meshrun::testing
