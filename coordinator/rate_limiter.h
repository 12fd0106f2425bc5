// RateLimiter: one token bucket per caller (a peer host or an authenticated identity), used to
// limit SubmitJob (--submit-rate, --submit-burst). Buckets are kept for at most `max_callers`
// callers: full (idle) buckets are forgotten first, so the table itself stays bounded.
//
// Thread-safe (one mutex). Called by CoordinatorServiceImpl; time comes from the injected Clock.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "coordinator/clock.h"

namespace meshrun::coordinator {

struct RateLimit {
  double per_second = 10;  // tokens added per second; 0: no limit
  double burst = 20;       // bucket size: calls allowed at once after a quiet spell
  size_t max_callers = 10'000;

  bool unlimited() const { return per_second <= 0; }
};

class RateLimiter {
 public:
  RateLimiter(const Clock& clock, RateLimit limit);

  // Takes one token from `caller`'s bucket: nullopt when it had one (the call may go on), else
  // how long until it will have one.
  std::optional<std::chrono::milliseconds> TryAcquire(const std::string& caller);

  const RateLimit& limit() const { return limit_; }
  size_t caller_count() const;

 private:
  struct Bucket {
    double tokens = 0;
    MonoTime updated;
  };
  // Tops `b` up to `now` (at most to the burst).
  void Refill(Bucket& b, MonoTime now) const;
  // Makes room for one more caller: drops full buckets, else the least recently used one.
  void EvictLocked(MonoTime now);

  const Clock& clock_;
  const RateLimit limit_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_;  // guarded by mu_
};

// The caller key of a gRPC peer string: the address without its port ("ipv4:10.0.0.5:41234"
// → "ipv4:10.0.0.5", "ipv6:[::1]:5000" → "ipv6:[::1]"); other forms are kept whole.
std::string CallerOfPeer(const std::string& peer);

// Callers keyed by their bearer token start with this; messages show them as "this token".
inline constexpr char kTokenCallerPrefix[] = "token:";

}  // namespace meshrun::coordinator
