// The host-resources probe (host_resources.h).
#include "common/host_resources.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace meshrun {

namespace {

// The first line of `path` split in words; empty when it cannot be read.
std::vector<std::string> HostProbeWords(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> words;
  if (!std::getline(in, line)) return words;
  std::istringstream split(line);
  for (std::string w; split >> w;) words.push_back(w);
  return words;
}

// A positive number, or 0 for "max", -1 and anything unreadable.
double HostProbeNumber(const std::string& text) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    return used == text.size() && v > 0 && std::isfinite(v) ? v : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

double CgroupMemoryLimit(const std::string& root) {
  for (const std::string& file : {root + "/memory.max", root + "/memory/memory.limit_in_bytes"}) {
    const std::vector<std::string> w = HostProbeWords(file);
    if (!w.empty()) return HostProbeNumber(w[0]);
  }
  return 0;
}

// The CPU quota in cores (fractional), 0 when there is none.
double CgroupCpuQuota(const std::string& root) {
  const std::vector<std::string> v2 = HostProbeWords(root + "/cpu.max");
  if (v2.size() == 2) {
    const double quota = HostProbeNumber(v2[0]), period = HostProbeNumber(v2[1]);
    return quota > 0 && period > 0 ? quota / period : 0;
  }
  const std::vector<std::string> quota = HostProbeWords(root + "/cpu/cpu.cfs_quota_us");
  const std::vector<std::string> period = HostProbeWords(root + "/cpu/cpu.cfs_period_us");
  if (quota.empty() || period.empty()) return 0;
  const double q = HostProbeNumber(quota[0]), p = HostProbeNumber(period[0]);
  return q > 0 && p > 0 ? q / p : 0;
}

}  // namespace

HostResources CapByCgroup(HostResources physical, const std::string& cgroup_root) {
  HostResources r = physical;
  const double limit = CgroupMemoryLimit(cgroup_root);
  if (limit > 0 && (r.memory_bytes <= 0 || limit < r.memory_bytes)) r.memory_bytes = limit;
  const double quota = CgroupCpuQuota(cgroup_root);
  if (quota > 0) r.cores = std::min(r.cores, static_cast<int>(std::ceil(quota - 1e-9)));
  r.cores = std::max(1, r.cores);
  return r;
}

HostResources ProbeHostResources(const std::string& cgroup_root) {
  HostResources physical;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  physical.memory_bytes = pages > 0 && page > 0 ? double(pages) * double(page) : 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  physical.cores = sched_getaffinity(0, sizeof(set), &set) == 0
                       ? CPU_COUNT(&set)
                       : static_cast<int>(std::thread::hardware_concurrency());
  return CapByCgroup(physical, cgroup_root);
}

}  // namespace meshrun
