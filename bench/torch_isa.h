// The instruction set the PyTorch columns of bench/train_step and bench/kernels run with.
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

}  // namespace meshrun::bench
