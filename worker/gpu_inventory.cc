// CudaInventory, CudaSlots, PickGpu, GpuRankEnv, InterfaceOf (gpu_inventory.h).
#include "worker/gpu_inventory.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstring>
#include <map>

namespace meshrun {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.erase(s.begin());
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
  return s;
}

bool IsIndex(const std::string& s) {
  if (s.empty() || s.size() > 4) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Numeric address text of a sockaddr ("" for other families).
std::string AddressText(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

}  // namespace

StatusOr<std::vector<GpuDevice>> CudaInventory(const std::vector<GpuDevice>& nvml,
                                               const char* visible, const std::string& why) {
  std::vector<GpuDevice> out;
  std::string visible_note;
  if (visible != nullptr) {
    std::map<int, const GpuDevice*> by_index;
    for (const GpuDevice& d : nvml) by_index[d.index] = &d;
    std::string list = visible;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t comma = list.find(',', start);
      const std::string entry =
          Trim(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      start = comma == std::string::npos ? list.size() + 1 : comma + 1;
      if (entry.empty()) continue;
      // CUDA stops at the first invalid entry ("-1" hides every device).
      if (IsIndex(entry)) {
        auto it = by_index.find(std::stoi(entry));
        if (it == by_index.end()) break;
        GpuDevice d = *it->second;
        d.id = entry;
        out.push_back(d);
      } else if (entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0) {
        GpuDevice d;
        d.index = static_cast<int>(out.size());
        d.id = entry;
        out.push_back(d);
      } else {
        break;
      }
    }
    visible_note = std::string(", CUDA_VISIBLE_DEVICES=\"") + visible + "\"";
  } else {
    out = nvml;
    for (GpuDevice& d : out) d.id = std::to_string(d.index);
  }
  if (out.empty()) {
    return InvalidArgumentError(
        "--device: cuda, but this node offers no GPU (" +
        (why.empty() ? std::string("NVML: 0 devices") : why) + visible_note +
        ") (hint: run the worker on a node with an NVIDIA GPU and its driver, check "
        "CUDA_VISIBLE_DEVICES, or use --device cpu)");
  }
  return out;
}

StatusOr<int> CudaSlots(int gpus, int requested) {
  if (requested <= 0) return gpus;
  if (requested > gpus) {
    return InvalidArgumentError("--slots: " + std::to_string(requested) + " slots for " +
                                std::to_string(gpus) +
                                " GPU(s); each cuda rank needs a GPU of its own (hint: use "
                                "--slots " +
                                std::to_string(gpus) + " or leave --slots out)");
  }
  return requested;
}

std::optional<int> PickGpu(int local_rank, const std::vector<bool>& in_use) {
  const int n = static_cast<int>(in_use.size());
  if (local_rank >= 0 && local_rank < n && !in_use[local_rank]) return local_rank;
  for (int i = 0; i < n; ++i) {
    if (!in_use[i]) return i;
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> GpuRankEnv(const GpuDevice& gpu,
                                                            const std::string& ifname,
                                                            double peak_tflops) {
  std::vector<std::pair<std::string, std::string>> env = {{"CUDA_VISIBLE_DEVICES", gpu.id},
                                                          {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"}};
  if (!ifname.empty()) env.emplace_back("NCCL_SOCKET_IFNAME", ifname);
  if (peak_tflops > 0) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.10g", peak_tflops);
    env.emplace_back("MESHRUN_PEAK_TFLOPS", buf);
  }
  return env;
}

std::string InterfaceOf(const std::string& address) {
  std::vector<std::string> wanted;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_flags = AI_ADDRCONFIG;
  addrinfo* res = nullptr;
  if (getaddrinfo(address.c_str(), nullptr, &hints, &res) == 0) {
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) wanted.push_back(AddressText(a->ai_addr));
    freeaddrinfo(res);
  }
  if (wanted.empty()) return "";
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return "";
  std::string found;
  for (ifaddrs* i = ifs; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const std::string text = AddressText(i->ifa_addr);
    for (const std::string& w : wanted) {
      if (!text.empty() && text == w) {
        found = i->ifa_name;
        break;
      }
    }
  }
  freeifaddrs(ifs);
  return found;
}

std::string DescribeGpus(const std::vector<GpuDevice>& gpus) {
  std::string out;
  for (const GpuDevice& d : gpus) {
    if (!out.empty()) out += ", ";
    out += "cuda:" + d.id + " " + (d.name.empty() ? std::string("(unnamed)") : d.name);
    if (d.memory_bytes > 0) out += " (" + std::to_string(d.memory_bytes >> 30) + " GiB)";
  }
  return out;
}

}  // namespace meshrun
