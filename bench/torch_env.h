// The environment the PyTorch columns of bench/train_step and bench/kernels run with: the
// instruction set, and the allocator.
//
// MESHRUN_NO_AVX512=1 puts meshrun on its AVX2 path on an AVX-512 CPU, standing in for an AVX2
// machine. PyTorch beside it would still run MKL's, ATen's, oneDNN's and torch.compile's AVX-512
// code, which no AVX2 machine has, so the comparison would be against a CPU that is not being
// simulated. Each of those libraries has its own documented switch: MKL_ENABLE_INSTRUCTIONS
// (MKL's dispatcher), ATEN_CPU_CAPABILITY (ATen's kernels and inductor's generated code),
// ONEDNN_MAX_CPU_ISA (oneDNN). When meshrun's kernels run AVX2 on a CPU with AVX-512, the benches
// put the three in front of every PyTorch command, so both sides run what an AVX2 machine runs;
// `--torch-isa native` leaves PyTorch unrestricted. The benches print which one ran.
#pragma once

#include <unistd.h>

#include <cstring>
#include <string>

#include "engine/kernels/cpu/kernels.h"

namespace meshrun::bench {

// Whether meshrun's kernels are held below what the CPU has (the AVX2 switch on an AVX-512 CPU).
inline bool KernelsHeldToAvx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return std::strcmp(cpu::KernelIsa(), "avx2") == 0 && __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// The environment assignments (each followed by a space) that hold a PyTorch command to the
// instruction set meshrun's kernels run with; empty when they run what the CPU has, or native.
inline std::string TorchIsaEnv(bool native) {
  if (native || !KernelsHeldToAvx2()) return "";
  return "MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ";
}

// One line for a bench's header: what the PyTorch columns ran with.
inline std::string TorchIsaDescription(bool native) {
  const std::string env = TorchIsaEnv(native);
  if (!env.empty()) {
    return "held to AVX2 like meshrun's kernels (" + env.substr(0, env.size() - 1) + ")";
  }
  if (KernelsHeldToAvx2()) return "native (AVX-512: --torch-isa native) while meshrun runs AVX2";
  return "native";
}

// The allocator. PyTorch's eager CPU path allocates and frees each op's output; with glibc's
// malloc a GPT-2 124M step at T = 1024 (outputs of 12–50 MB, above glibc's largest mmap
// threshold) maps and unmaps them op by op, and the page faults and zeroing that follow took
// more system time than compute on this bench's machine (eager 122 tokens/s, 61 s sys in a
// 69 s run). PyTorch's CPU tuning guide recommends jemalloc or tcmalloc: with Debian's
// libjemalloc2 preloaded and its pages kept (no decay) the same run gave 213 tokens/s. The
// strongest baseline is that one, so it is the default wherever the library is installed
// (`apt install libjemalloc2`); `--torch-malloc system` runs glibc's.
inline constexpr const char* kJemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

inline bool JemallocInstalled() {
  return access(kJemalloc, R_OK) == 0;
}

// Environment assignments (each followed by a space) for PyTorch's allocator; empty for glibc's.
inline std::string TorchMallocEnv(bool system) {
  if (system || !JemallocInstalled()) return "";
  return std::string("LD_PRELOAD=") + kJemalloc +
         " MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 ";
}

inline std::string TorchMallocDescription(bool system) {
  if (!TorchMallocEnv(system).empty()) {
    return std::string("jemalloc, pages kept (") + kJemalloc + ")";
  }
  return system ? "glibc (--torch-malloc system)"
                : std::string("glibc (") + kJemalloc + " not installed: apt install libjemalloc2)";
}

}  // namespace meshrun::bench
