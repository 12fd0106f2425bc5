// The one probe of this host's resources: memory and CPUs as the process may use them, that is
// the physical figures capped by the cgroup it runs in (a container's limits). Read by the
// worker (its slots' cores and memory), the planner and the pre-flight checks.
#pragma once

#include <string>

namespace meshrun {

struct HostResources {
  double memory_bytes = 0;  // 0: unknown
  int cores = 1;            // at least 1
};

// Physical memory (sysconf) and the CPUs this process may run on (sched_getaffinity), each
// capped by the cgroup under `cgroup_root`: memory by v2 `memory.max` or v1
// `memory/memory.limit_in_bytes`, CPUs by v2 `cpu.max` ("QUOTA PERIOD", "max" for none) or v1
// `cpu/cpu.cfs_quota_us` over `cpu/cpu.cfs_period_us` (-1 for none), rounded up to whole cores.
// Unreadable or unlimited files leave the physical figure.
HostResources ProbeHostResources(const std::string& cgroup_root = "/sys/fs/cgroup");

// The same, applied to given physical figures (tests pass fake cgroup folders).
HostResources CapByCgroup(HostResources physical, const std::string& cgroup_root);

}  // namespace meshrun
