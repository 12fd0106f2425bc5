// RateLimiter (see rate_limiter.h): token buckets refilled lazily on each call.
#include "coordinator/rate_limiter.h"

#include <algorithm>
#include <cmath>

namespace meshrun::coordinator {

RateLimiter::RateLimiter(const Clock& clock, RateLimit limit) : clock_(clock), limit_(limit) {}

void RateLimiter::Refill(Bucket& b, MonoTime now) const {
  if (now <= b.updated) return;
  const double seconds = std::chrono::duration<double>(now - b.updated).count();
  b.tokens = std::min(limit_.burst, b.tokens + seconds * limit_.per_second);
  b.updated = now;
}

void RateLimiter::EvictLocked(MonoTime now) {
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    Refill(it->second, now);
    it = it->second.tokens >= limit_.burst ? buckets_.erase(it) : std::next(it);
  }
  while (buckets_.size() >= std::max<size_t>(1, limit_.max_callers)) {
    auto oldest = std::min_element(
        buckets_.begin(), buckets_.end(),
        [](const auto& a, const auto& b) { return a.second.updated < b.second.updated; });
    buckets_.erase(oldest);
  }
}

std::optional<std::chrono::milliseconds> RateLimiter::TryAcquire(const std::string& caller) {
  if (limit_.unlimited()) return std::nullopt;
  const MonoTime now = clock_.Monotonic();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = buckets_.find(caller);
  if (it == buckets_.end()) {
    if (buckets_.size() >= std::max<size_t>(1, limit_.max_callers)) EvictLocked(now);
    it = buckets_.emplace(caller, Bucket{std::max(1.0, limit_.burst), now}).first;
  }
  Bucket& b = it->second;
  Refill(b, now);
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return std::nullopt;
  }
  const double wait_s = (1 - b.tokens) / limit_.per_second;
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(wait_s * 1000)));
}

size_t RateLimiter::caller_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buckets_.size();
}

std::string CallerOfPeer(const std::string& peer) {
  if (peer.rfind("ipv4:", 0) != 0 && peer.rfind("ipv6:", 0) != 0) return peer;
  const size_t colon = peer.rfind(':');
  if (colon == std::string::npos || colon < 5) return peer;
  // For ipv6 the port follows the closing bracket.
  if (peer.rfind("ipv6:", 0) == 0 && (colon == 0 || peer[colon - 1] != ']')) return peer;
  return peer.substr(0, colon);
}

}  // namespace meshrun::coordinator
