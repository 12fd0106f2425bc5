// The GPT-2 of docs/model.md on one CUDA device: the same parameter layout and names as the CPU
// model (engine/model/gpt2.h, GPT2ParamLayout), so weights copy over in both directions; forward,
// forward+backward and the clipped AdamW update, in execution order (llm.c style).
//
// Precision: fp32 master weights, fp32 gradients and fp32 AdamW state always. kBFloat16 keeps a
// bf16 copy of the weights (refreshed by every update) for the GEMMs and runs activations in
// bf16; kFloat32 runs everything in float32 (the reference the tests hold tightly to the CPU).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "engine/core/tensor.h"
#include "engine/model/gpt2.h"
#include "engine/train/optimizer.h"

namespace meshrun::gpu {

enum class Precision { kFloat32, kBFloat16 };

// "fp32" or "bf16" (TrainSpec::precision); INVALID_ARGUMENT otherwise.
StatusOr<Precision> ParsePrecision(const std::string& name);
const char* PrecisionName(Precision p);

struct GPT2CudaOptions {
  int device = 0;
  Precision precision = Precision::kBFloat16;
  // bf16 with head size 64: the WMMA flash-attention kernels; false forces the CUDA-core ones.
  bool tensor_core_attention = true;
};

// Owns the model's device memory (from CudaAllocator(device)), its stream and cuBLASLt handle.
// Not thread-safe: one thread (the rank's training thread) calls it. Calls that return data to
// the host synchronize; the others only enqueue work (errors surface at the next synchronizing
// call at the latest).
class GPT2Cuda {
 public:
  // INVALID_ARGUMENT for a config the kernels cannot run (d_model % n_head != 0, head size
  // > 256); UNAVAILABLE without a CUDA device.
  static StatusOr<std::unique_ptr<GPT2Cuda>> Create(const GPT2Config& cfg,
                                                    const GPT2CudaOptions& options = {});
  ~GPT2Cuda();
  GPT2Cuda(const GPT2Cuda&) = delete;
  GPT2Cuda& operator=(const GPT2Cuda&) = delete;

  const GPT2Config& config() const;
  const std::vector<ParamInfo>& params() const;
  int64_t num_params() const;
  Precision precision() const;

  // The same values as GPT2<T>::InitDeterministic(seed) (computed on the host, then copied).
  Status InitDeterministic(uint64_t seed);
  // Host buffers of num_params() floats in the flat layout of GPT2ParamLayout.
  Status SetParams(const float* host);
  Status GetParams(float* host);
  Status GetGrads(float* host);
  Status ZeroGrad();

  // Forward of B sequences of seq_len tokens (host token ids, B·seq_len of them). Keeps the
  // activations and logits for GetLogits or a following backward.
  Status Forward(const int32_t* inputs, int B, int seq_len);
  // The logits of the last Forward: B·seq_len·vocab_size floats (row-major).
  Status GetLogits(float* host);

  // Sum of per-token losses of a batch without touching gradients.
  StatusOr<double> ForwardLoss(const int32_t* inputs, const int32_t* targets, int B, int seq_len);
  // Forward, loss and backward of one micro-batch, as GPT2<T>::ForwardBackward: returns the SUM
  // of per-token losses and adds grad_scale·∂(sum of losses) to the gradients.
  StatusOr<double> ForwardBackward(const int32_t* inputs, const int32_t* targets, int B,
                                   int seq_len, double grad_scale);

  // As ShardedState::ClipAndStep (engine/train/sharding.h) on one rank: clip by the global L2 norm
  // (factor clip/(norm + 1e-6) when norm > clip), then AdamW for update `step` (0-based) with the
  // schedule of docs/model.md and weight decay on 2+-dim parameters; refreshes the bf16 weights.
  StatusOr<UpdateResult> ClipAndAdamW(const TrainSpec& train, int64_t step);

  // Device memory of this process on the model's device (docs/metrics.md).
  MemoryStats memory_stats() const;
  Status Synchronize();

  class Impl;

 private:
  explicit GPT2Cuda(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshrun::gpu
