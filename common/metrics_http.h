// The options of the civetweb server behind prometheus-cpp's Exposer, for the coordinator's and
// the workers' /metrics: enough threads that a few idle or slow clients do not hold every one
// (Exposer's default is 2: two idle connections blocked every scrape for 30 s), a short read
// timeout so that a connection that never sends its request is dropped, and no keep-alive so
// that a finished scrape gives its thread back (docs/security.md "Limits").
#pragma once

#include <string>
#include <vector>

namespace meshrun {

inline constexpr int kMetricsHttpThreads = 16;
inline constexpr int kMetricsHttpRequestTimeoutMs = 3'000;

inline std::vector<std::string> MetricsHttpOptions(const std::string& listen) {
  return {"listening_ports",    listen,
          "num_threads",        std::to_string(kMetricsHttpThreads),
          "request_timeout_ms", std::to_string(kMetricsHttpRequestTimeoutMs),
          "enable_keep_alive",  "no"};
}

}  // namespace meshrun
