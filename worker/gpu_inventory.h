// The GPUs a `meshrun-worker --device cuda` offers and how each rank gets one (docs/gpu.md
// "Workers that own GPUs"): the devices NVML lists (restricted to the worker's own
// CUDA_VISIBLE_DEVICES when it has one), one slot per GPU by default, and per rank
// CUDA_VISIBLE_DEVICES = its GPU (so the rank sees exactly one, as device 0),
// CUDA_DEVICE_ORDER = PCI_BUS_ID (NVML's order) and NCCL_SOCKET_IFNAME = the interface that
// holds --address. Pure functions but InterfaceOf (getifaddrs) and the NVML read in main.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace meshrun {

struct GpuDevice {
  int index = 0;     // NVML's index (PCI bus order)
  std::string id;    // what CUDA_VISIBLE_DEVICES names it by: the index, or the worker's entry
  std::string name;  // "NVIDIA H200"
  uint64_t memory_bytes = 0;
};

// The GPUs this worker offers: `nvml` (every device of the node), or — when the worker's
// CUDA_VISIBLE_DEVICES (`visible`, null when unset) is set — the entries it lists, in its order
// (numeric entries take NVML's name and memory; UUIDs and MIG ids are kept as given).
// INVALID_ARGUMENT naming --device when none is left, with `why` (NVML's error, or "0 devices")
// in the message and a hint.
StatusOr<std::vector<GpuDevice>> CudaInventory(const std::vector<GpuDevice>& nvml,
                                               const char* visible, const std::string& why);

// --slots of a cuda worker: `requested` (0: not given) or one per GPU. INVALID_ARGUMENT naming
// --slots when more are asked for than there are GPUs (each rank needs its own).
StatusOr<int> CudaSlots(int gpus, int requested);

// The GPU of a rank with `local_rank`: that one when it is free, else the lowest free one;
// nullopt when all are taken. `in_use[i]` says whether GPU i runs a rank now.
std::optional<int> PickGpu(int local_rank, const std::vector<bool>& in_use);

// The variables a cuda rank gets: CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, NCCL_SOCKET_IFNAME
// (when `ifname` is not empty), MESHRUN_PEAK_TFLOPS (when `peak_tflops` > 0).
std::vector<std::pair<std::string, std::string>> GpuRankEnv(const GpuDevice& gpu,
                                                            const std::string& ifname,
                                                            double peak_tflops);

// The network interface that holds `address` (an IP or a host name resolved by getaddrinfo),
// e.g. "eth0", "lo"; "" when no local interface has it.
std::string InterfaceOf(const std::string& address);

// "2 × NVIDIA H200 (141 GiB)"-style summary for the worker's start line.
std::string DescribeGpus(const std::vector<GpuDevice>& gpus);

}  // namespace meshrun
