// The device-generic ops of the model: one function per op, taking the device its buffers live
// on and dispatching once per call (never per element) to the CPU kernel of
// engine/kernels/cpu/kernels.h or the CUDA kernel of engine/cuda/kernels.h. The model
// (engine/model/gpt2.*), the sharded state and the optimizer call only these. Each op's
// parameters and contract are written once, in the op table (engine/ops/op_table.inc), which also
// declares the CPU kernels and generates the dispatch (engine/ops/dispatch.cc; decision 0067).
//
// Semantics are those of the CPU kernels (row-major, backward kernels ACCUMULATE, attention masks
// by global positions). Every pointer argument is a buffer on `dev` (token ids and positions
// included); host↔device traffic goes through CopyFromHost / CopyToHost and the scalar results
// (Sum, SumOfSquares).
//
// On cuda: float32 only (the product instantiates the ops for float only; T = double, in the tests'
// float64 twins, answers INVALID_ARGUMENT; bf16 GEMMs: SetMatmulPrecision); work
// is enqueued on the device's compute stream (ops::ComputeStreamOf) and the functions that return a
// host value synchronize. In an engine built without CUDA every op on a cuda device answers
// UNAVAILABLE saying so.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "engine/core/tensor.h"
#include "engine/ops/op_table_macros.h"

namespace meshrun::ops {

// True when this engine was built with the CUDA path.
bool CudaBuilt();

// ---- memory.
Status CopyFromHost(Device dev, void* dst, const void* host_src, size_t bytes);  // then complete
Status CopyToHost(Device dev, void* host_dst, const void* src, size_t bytes);    // synchronizes
Status Copy(Device dev, void* dst, const void* src, size_t bytes);               // same device
Status Zero(Device dev, void* dst, size_t bytes);  // Fill: see the op table below
// Waits for everything enqueued on dev (no-op on cpu).
Status Synchronize(Device dev);
// The stream the ops enqueue on for `dev` (a cudaStream_t; null on cpu), for the communicator
// that must order its collectives after them (MeshComms::SetComputeStream).
StatusOr<void*> ComputeStreamOf(Device dev);

// ---- mixed precision (train.precision: bf16, cuda only). With kBf16 set for a cuda device,
// MatmulForward / MatmulBackward<float> on it cast their operands (input, weight, output
// gradient) to bf16 and run the GEMMs in bf16 on cuBLASLt with float32 accumulation and float32
// results (outputs, input gradients, weight gradients, bias gradients from the float32 dout);
// every other op stays float32. A GEMM cuBLASLt has no bf16 algorithm for runs in float32. Per
// device and process-wide (the rank's trainer sets it at start). A cpu device takes only kFloat32
// (INVALID_ARGUMENT otherwise).
enum class MatmulPrecision { kFloat32, kBf16 };
Status SetMatmulPrecision(Device dev, MatmulPrecision precision);
// The bf16 GEMMs keep the bf16 copy of the last weight they read while nothing may have written
// it: every op here that may write parameters (copies, fills, Zero, Scale, AdamW, CastFromBf16)
// says so itself; a caller that writes parameters another way (a collective into a gathered
// unit) calls this. No-op on cpu.
void ParametersChanged(Device dev);
MatmulPrecision MatmulPrecisionOf(Device dev);
// bf16 (stored as its 16 bits) ↔ float32, round to nearest even; on any device.
Status CastToBf16(Device dev, uint16_t* dst, const float* src, int64_t n);
Status CastFromBf16(Device dev, float* dst, const uint16_t* src, int64_t n);

// ---- the ops with a kernel on each device, one row each in engine/ops/op_table.inc with its
// contract: MESHRUN_OP(Name, (type, name)...) declares here
//   template <typename T> Status Name(Device dev, type name, ...);
// (a MESHRUN_REDUCTION_OP returns StatusOr<double>; a MESHRUN_FLOAT_OP is float32 only, no
// template), e.g. MatmulForward(dev, out, inp, weight, bias, N, C, OC).
#define MESHRUN_OP(name, ...) \
  template <typename T>       \
  Status name(Device dev, MESHRUN_PP_LIST(MESHRUN_PARAM_DECL, __VA_ARGS__));
#define MESHRUN_REDUCTION_OP(name, ...) \
  template <typename T>                 \
  StatusOr<double> name(Device dev, MESHRUN_PP_LIST(MESHRUN_PARAM_DECL, __VA_ARGS__));
#define MESHRUN_FLOAT_OP(name, ...) \
  Status name(Device dev, MESHRUN_PP_LIST(MESHRUN_PARAM_DECL, __VA_ARGS__));
#include "engine/ops/op_table.inc"

}  // namespace meshrun::ops
