// Tensor storage and the counting CPU allocator.
#include "engine/core/tensor.h"

#include <sys/mman.h>

#include <atomic>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "engine/core/counted_address.h"

#if MESHRUN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "engine/core/cuda_allocator.h"
#endif

namespace meshrun {

size_t ScalarTypeSize(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::kFloat32: return 4;
    case ScalarType::kFloat64: return 8;
    case ScalarType::kBFloat16: return 2;
    case ScalarType::kInt32: return 4;
  }
  return 0;
}

const char* ScalarTypeName(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::kFloat32: return "float32";
    case ScalarType::kFloat64: return "float64";
    case ScalarType::kBFloat16: return "bfloat16";
    case ScalarType::kInt32: return "int32";
  }
  return "?";
}

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kParameters: return "parameters";
    case MemoryKind::kGradients: return "gradients";
    case MemoryKind::kOptimizer: return "optimizer";
    case MemoryKind::kActivations: return "activations";
    case MemoryKind::kCommunication: return "communication";
    case MemoryKind::kOther: return "other";
  }
  return "other";
}

// The per-kind ledger of one device type (of the process, or of a MemoryAccount).
struct MemoryLedger {
  std::mutex mu;
  MemoryBreakdown counts;
  void Add(MemoryKind kind, int64_t bytes) {
    const int k = static_cast<int>(kind);
    std::lock_guard<std::mutex> lock(mu);
    counts.allocated[k] += bytes;
    if (counts.allocated[k] > counts.peak[k]) counts.peak[k] = counts.allocated[k];
  }
};

namespace {

thread_local MemoryKind current_kind = MemoryKind::kOther;

MemoryLedger& LedgerOf(DeviceType device) {
  static MemoryLedger* ledgers = new MemoryLedger[3];  // never destroyed (tensors may outlive main)
  return ledgers[static_cast<int>(device)];
}

int LedgerIndex(DeviceType device) {
  return static_cast<int>(device);
}

}  // namespace

// A MemoryAccountScope's ledgers; kept alive by every tensor counted in it.
struct MemoryAccount {
  MemoryLedger ledgers[3];  // by DeviceType
};

namespace {

thread_local std::shared_ptr<MemoryAccount> current_account;

// What MemoryBreakdownOf and ResetMemoryBreakdownPeak read on this thread.
MemoryLedger& ThreadLedgerOf(DeviceType device) {
  return current_account ? current_account->ledgers[LedgerIndex(device)] : LedgerOf(device);
}

}  // namespace

MemoryAccountScope::MemoryAccountScope() : previous_(current_account) {
  current_account = std::make_shared<MemoryAccount>();
}
MemoryAccountScope::~MemoryAccountScope() {
  current_account = previous_;
}

MemoryKindScope::MemoryKindScope(MemoryKind kind) : previous_(current_kind) {
  current_kind = kind;
}
MemoryKindScope::~MemoryKindScope() {
  current_kind = previous_;
}
MemoryKind CurrentMemoryKind() {
  return current_kind;
}

MemoryBreakdown MemoryBreakdownOf(DeviceType device) {
  MemoryLedger& l = ThreadLedgerOf(device);
  std::lock_guard<std::mutex> lock(l.mu);
  return l.counts;
}

void ResetMemoryBreakdownPeak(DeviceType device) {
  MemoryLedger& l = ThreadLedgerOf(device);
  std::lock_guard<std::mutex> lock(l.mu);
  for (int k = 0; k < kNumMemoryKinds; ++k) l.counts.peak[k] = l.counts.allocated[k];
}

namespace {

// The bookkeeping both allocators below share: live, peak and reserved bytes of the blocks
// handed out, each rounded up to 64 bytes.
class CountedBlocks : public Allocator {
 public:
  static size_t Rounded(size_t bytes) { return (bytes + 63) / 64 * 64; }
  MemoryStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void ResetPeak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.allocated_bytes;
  }

 protected:
  // A block of `rounded` bytes handed out (> 0) or given back (< 0).
  void Count(int64_t rounded) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated_bytes += rounded;
    stats_.reserved_bytes += rounded;
    if (stats_.allocated_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.allocated_bytes;
  }

 private:
  mutable std::mutex mu_;
  MemoryStats stats_;
};

// Counts every byte it hands out. The engine allocates its buffers once per run, so a caching
// layer would buy nothing on CPU. Blocks of kMappedBlock and more are mapped and unmapped on
// their own, so a freed buffer leaves the process's resident set (glibc would otherwise serve
// later blocks from a heap that does not shrink): what the counts say is what the kernel sees.
// Smaller ones come from aligned_alloc. The allocator maps its own blocks instead of lowering
// glibc's mmap threshold for the whole process (mallopt(M_MMAP_THRESHOLD), which also switches
// off glibc's adaptive threshold): that made every other library's temporaries above 1 MiB a
// fresh mapping per call — oneDNN's sgemm packs into a 1.2–4.7 MB buffer it allocates per call,
// and each of them page-faulted and zeroed those pages again, 7% of a GPT-2 124M step on CPU
// (decision 0065).
class CountingCpuAllocator final : public CountedBlocks {
 public:
  static constexpr size_t kMappedBlock = size_t{1} << 20;

  void* Allocate(size_t bytes) override {
    const size_t rounded = Rounded(bytes);
    void* p = nullptr;
    if (rounded >= kMappedBlock) {
      // Page-aligned, hence 64-byte aligned.
      p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) p = nullptr;
    } else {
      p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    }
    if (p == nullptr) throw std::bad_alloc();
    Count(static_cast<int64_t>(rounded));
    return p;
  }
  void Free(void* ptr, size_t bytes) override {
    if (ptr == nullptr) return;
    const size_t rounded = Rounded(bytes);
    if (rounded >= kMappedBlock) {
      ::munmap(ptr, rounded);
    } else {
      std::free(ptr);
    }
    Count(-static_cast<int64_t>(rounded));
  }
  Device device() const override { return Device{DeviceType::kCpu, 0}; }
};

// The counting device's allocator: counts like the CPU's and hands out addresses of
// counted_address.h's range, distinct per buffer and 64-byte aligned, so that pointer arithmetic
// and identity work. Addresses are never reused, so every byte of every buffer stays inside the
// range: the range holds 2^60 bytes of allocations, far beyond any process's counts.
class CountingDeviceAllocator final : public CountedBlocks {
 public:
  void* Allocate(size_t bytes) override {
    const size_t rounded = Rounded(bytes);
    const uint64_t at = next_.fetch_add(rounded + 64, std::memory_order_relaxed);
    if (at + rounded + 64 > kCountedAddressSpan) throw std::bad_alloc();
    Count(static_cast<int64_t>(rounded));
    return reinterpret_cast<void*>(kCountedAddressBase + at);
  }
  void Free(void* ptr, size_t bytes) override {
    if (ptr != nullptr) Count(-static_cast<int64_t>(Rounded(bytes)));
  }
  Device device() const override { return Device{DeviceType::kCount, 0}; }

 private:
  std::atomic<uint64_t> next_{0};
};

}  // namespace

Allocator& CountingAllocator() {
  static CountingDeviceAllocator* allocator = new CountingDeviceAllocator();  // never destroyed
  return *allocator;
}

Allocator& CpuAllocator() {
  static CountingCpuAllocator* allocator = new CountingCpuAllocator();  // never destroyed
  return *allocator;
}

Allocator& AllocatorFor(Device device) {
  if (device.type == DeviceType::kCpu) return CpuAllocator();
  if (device.type == DeviceType::kCount) return CountingAllocator();
#if MESHRUN_WITH_CUDA
  return gpu::CudaAllocator(device.index);
#else
  throw std::runtime_error("only the cpu allocator is built into this engine");
#endif
}

Tensor::Storage::~Storage() {
  if (allocator == nullptr) return;
  allocator->Free(ptr, bytes);
  const DeviceType type = allocator->device().type;
  LedgerOf(type).Add(kind, -static_cast<int64_t>(bytes));
  if (account) account->ledgers[LedgerIndex(type)].Add(kind, -static_cast<int64_t>(bytes));
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::Empty(std::vector<int64_t> shape, ScalarType dtype, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  auto storage = std::make_shared<Storage>();
  storage->allocator = &AllocatorFor(device);
  storage->bytes = t.nbytes();
  storage->ptr = storage->allocator->Allocate(storage->bytes);
  storage->kind = current_kind;
  LedgerOf(device.type).Add(storage->kind, static_cast<int64_t>(storage->bytes));
  storage->account = current_account;
  if (current_account) {
    current_account->ledgers[LedgerIndex(device.type)].Add(storage->kind,
                                                           static_cast<int64_t>(storage->bytes));
  }
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::Zeros(std::vector<int64_t> shape, ScalarType dtype, Device device) {
  Tensor t = Empty(std::move(shape), dtype, device);
  if (device.type == DeviceType::kCpu) {
    std::memset(t.raw(), 0, t.nbytes());
  } else if (device.type == DeviceType::kCount) {
    // nothing to zero: the counting device holds no data
  } else {
#if MESHRUN_WITH_CUDA
    // cudaMemset runs on the legacy stream, which the engine's non-blocking compute stream does
    // not wait for, nor it for that stream: wait first for the block's previous users (the
    // caching allocator may just have recycled it from compute-stream work), then for the
    // memset, so the tensor is zero for every stream once this returns.
    if (t.nbytes() > 0 && (cudaDeviceSynchronize() != cudaSuccess ||
                           cudaMemset(t.raw(), 0, t.nbytes()) != cudaSuccess ||
                           cudaDeviceSynchronize() != cudaSuccess)) {
      throw std::runtime_error("Tensor::Zeros: cudaMemset failed");
    }
#endif
  }
  return t;
}

Tensor Tensor::View(int64_t element_offset, std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.offset_bytes_ = offset_bytes_ + static_cast<size_t>(element_offset) * ScalarTypeSize(dtype_);
  assert(t.offset_bytes_ + t.nbytes() <= storage_->bytes);
  return t;
}

void Tensor::Fill(double value) {
  if (device_.type == DeviceType::kCount) return;  // no data there
  if (device_.type != DeviceType::kCpu) {
    throw std::runtime_error("Tensor::Fill: cpu tensors only (ops::Fill fills device buffers)");
  }
  const int64_t n = numel();
  switch (dtype_) {
    case ScalarType::kFloat32: {
      float* p = data<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(value);
      break;
    }
    case ScalarType::kFloat64: {
      double* p = data<double>();
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      break;
    }
    case ScalarType::kInt32: {
      int32_t* p = data<int32_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value);
      break;
    }
    case ScalarType::kBFloat16: throw std::runtime_error("Fill: bfloat16 not supported on cpu");
  }
}

std::string Tensor::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[i]);
  }
  return s + "]";
}

}  // namespace meshrun
