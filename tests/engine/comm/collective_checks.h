// Runs every Communicator op on one rank against a serial reference and reports the first
// mismatch as text (empty when all agree). Shared by the fake backend tests (threads) and the
// Gloo tests (forked processes, where gtest assertions cannot be used), so both backends are
// held to the same semantics. Inputs are small integers so float sums are exact in any order.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/communicator.h"

namespace meshrun::testing {

// Runs body(rank) on n threads, one per rank of a fake world, and joins them.
inline void RunRanks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

// Element i of rank r's input to a reduction.
inline float ReduceInput(int r, size_t i) {
  return static_cast<float>((r + 1) * (i % 13 + 1));
}
// Σ over ranks 0..n-1 of ReduceInput(r, i).
inline float ReduceSum(int n, size_t i) {
  return static_cast<float>(n * (n + 1) / 2 * (i % 13 + 1));
}
// Element i of rank r's contribution to a gather or a message.
inline float GatherInput(int r, size_t i) {
  return static_cast<float>(r * 1000 + i % 997);
}

inline std::string Where(const std::string& op, size_t count, size_t i, float got, float want) {
  return op + " count " + std::to_string(count) + ": element " + std::to_string(i) + " is " +
         std::to_string(got) + ", want " + std::to_string(want);
}

// The counts every op is checked with: empty, tiny, odd, and a few segments' worth.
inline std::vector<size_t> CheckCounts() {
  return {0, 1, 7, 1000, 70001};
}

inline std::string CheckCollectives(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  for (size_t count : CheckCounts()) {
    // all_reduce
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = ReduceInput(r, i);
    Status s = comm.AllReduce(data.data(), count);
    if (!s.ok()) return "all_reduce: " + s.ToString();
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != ReduceSum(n, i))
        return Where("all_reduce", count, i, data[i], ReduceSum(n, i));
    }

    // reduce_scatter: input n·count, output count
    std::vector<float> rs_in(count * n), rs_out(count, -1.f);
    for (size_t j = 0; j < rs_in.size(); ++j) rs_in[j] = ReduceInput(r, j);
    s = comm.ReduceScatter(rs_in.data(), rs_out.data(), count);
    if (!s.ok()) return "reduce_scatter: " + s.ToString();
    for (size_t i = 0; i < count; ++i) {
      const float want = ReduceSum(n, r * count + i);
      if (rs_out[i] != want) return Where("reduce_scatter", count, i, rs_out[i], want);
    }

    // all_gather, out of place and in place (input aliasing this rank's output slice)
    std::vector<float> ag_in(count), ag_out(count * n, -1.f);
    for (size_t i = 0; i < count; ++i) ag_in[i] = GatherInput(r, i);
    s = comm.AllGather(ag_in.data(), ag_out.data(), count);
    if (!s.ok()) return "all_gather: " + s.ToString();
    for (int p = 0; p < n; ++p) {
      for (size_t i = 0; i < count; ++i) {
        if (ag_out[p * count + i] != GatherInput(p, i)) {
          return Where("all_gather", count, p * count + i, ag_out[p * count + i],
                       GatherInput(p, i));
        }
      }
    }
    std::vector<float> ag_inplace(count * n, -1.f);
    for (size_t i = 0; i < count; ++i) ag_inplace[r * count + i] = GatherInput(r, i);
    s = comm.AllGather(ag_inplace.data() + r * count, ag_inplace.data(), count);
    if (!s.ok()) return "all_gather in place: " + s.ToString();
    if (ag_inplace != ag_out) return "all_gather in place differs from out of place";

    // broadcast from every root
    for (int root = 0; root < n; ++root) {
      std::vector<float> b(count, -1.f);
      if (r == root) {
        for (size_t i = 0; i < count; ++i) b[i] = GatherInput(root, i);
      }
      s = comm.Broadcast(b.data(), count, root);
      if (!s.ok()) return "broadcast root " + std::to_string(root) + ": " + s.ToString();
      for (size_t i = 0; i < count; ++i) {
        if (b[i] != GatherInput(root, i))
          return Where("broadcast", count, i, b[i], GatherInput(root, i));
      }
    }

    // ring exchange: send to the right, receive from the left (a self-exchange when n = 1)
    std::vector<float> ring_in(count), ring_out(count, -1.f);
    for (size_t i = 0; i < count; ++i) ring_in[i] = GatherInput(r, i);
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    s = comm.SendRecv(ring_in.data(), count, right, ring_out.data(), count, left);
    if (!s.ok()) return "send_recv: " + s.ToString();
    for (size_t i = 0; i < count; ++i) {
      if (ring_out[i] != GatherInput(left, i))
        return Where("send_recv", count, i, ring_out[i], GatherInput(left, i));
    }

    // send/recv between pairs (0→1, 2→3, …), then back
    if (n > 1) {
      const bool sender = r % 2 == 0;
      const int peer = sender ? r + 1 : r - 1;
      if (peer < n) {
        std::vector<float> msg(count);
        for (size_t i = 0; i < count; ++i) msg[i] = GatherInput(r, i);
        std::vector<float> got(count, -1.f);
        for (int round = 0; round < 2; ++round) {
          const bool sending = sender == (round == 0);
          s = sending ? comm.Send(msg.data(), count, peer) : comm.Recv(got.data(), count, peer);
          if (!s.ok()) return std::string(sending ? "send: " : "recv: ") + s.ToString();
        }
        for (size_t i = 0; i < count; ++i) {
          if (got[i] != GatherInput(peer, i))
            return Where("recv", count, i, got[i], GatherInput(peer, i));
        }
      }
    }
  }

  // raw bytes
  const std::string mine = "rank-" + std::to_string(r) + "!";
  const size_t len = mine.size() + 2;  // same length on every rank for n < 100
  std::string padded = mine + std::string(len - mine.size(), '\0');
  std::vector<char> gathered(len * n);
  Status s = comm.AllGatherBytes(padded.data(), gathered.data(), len);
  if (!s.ok()) return "all_gather bytes: " + s.ToString();
  for (int p = 0; p < n; ++p) {
    const std::string want = "rank-" + std::to_string(p) + "!";
    if (std::strncmp(gathered.data() + p * len, want.c_str(), want.size()) != 0) {
      return "all_gather bytes: slot " + std::to_string(p) + " is wrong";
    }
  }
  char word[16] = {};
  if (r == n - 1) std::strcpy(word, "meshrun-bytes");
  s = comm.BroadcastBytes(word, sizeof word, n - 1);
  if (!s.ok()) return "broadcast bytes: " + s.ToString();
  if (std::string(word) != "meshrun-bytes")
    return "broadcast bytes: got '" + std::string(word) + "'";

  s = comm.Barrier();
  if (!s.ok()) return "barrier: " + s.ToString();
  return "";
}

}  // namespace meshrun::testing
