// Tensors and the per-device allocators that count their memory.
// A Tensor is a shape, a dtype, a device and a shared reference to storage obtained from that
// device's Allocator; views share storage. The allocators count allocated, peak and reserved
// bytes, which the training loop reports as metrics (docs/metrics.md meshrun_rank_memory_bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace meshrun {

enum class ScalarType { kFloat32, kFloat64, kBFloat16, kInt32 };
// kCount, the counting device: tensors there have shapes, kinds and addresses but no memory,
// and every op on it does nothing (engine/ops), so running the engine's own step on it counts
// exactly what the step allocates, by kind, without computing or allocating (the planner's
// memory figures, engine/train/counted_step.h). Its addresses are never dereferenced.
enum class DeviceType { kCpu, kCuda, kCount };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

size_t ScalarTypeSize(ScalarType dtype);
const char* ScalarTypeName(ScalarType dtype);

struct MemoryStats {
  int64_t allocated_bytes = 0;  // live bytes handed out
  int64_t peak_bytes = 0;       // high-water mark of allocated_bytes
  int64_t reserved_bytes = 0;   // bytes held from the system (≥ allocated; caches keep more)
};

// What a buffer is for: the breakdown of a rank's memory (docs/parallelism.md). Tensors take
// the kind of the MemoryKindScope open on their thread when they are created.
enum class MemoryKind { kParameters, kGradients, kOptimizer, kActivations, kCommunication, kOther };
inline constexpr int kNumMemoryKinds = 6;
const char* MemoryKindName(MemoryKind kind);  // "parameters", …, "other"

// Live and peak bytes per kind on one device; the peak of each kind is its own high-water mark
// (the kinds' peaks need not coincide in time).
struct MemoryBreakdown {
  int64_t allocated[kNumMemoryKinds] = {};
  int64_t peak[kNumMemoryKinds] = {};
};

// Sets the kind of the tensors created on this thread while it lives (nests; restores on exit).
class MemoryKindScope {
 public:
  explicit MemoryKindScope(MemoryKind kind);
  ~MemoryKindScope();
  MemoryKindScope(const MemoryKindScope&) = delete;
  MemoryKindScope& operator=(const MemoryKindScope&) = delete;

 private:
  MemoryKind previous_;
};
MemoryKind CurrentMemoryKind();

// The per-kind counts of every tensor of a device type (process-wide, thread-safe); on a thread
// inside a MemoryAccountScope, of its account's tensors only.
MemoryBreakdown MemoryBreakdownOf(DeviceType device);
// Starts a new high-water mark for every kind of `device` (at the live bytes); on a thread inside
// a MemoryAccountScope, of its account only.
void ResetMemoryBreakdownPeak(DeviceType device);

// A part of the process counted on its own: while the scope is open on a thread, the tensors
// created there are counted in its account as well as the process's (until they are freed, on
// whatever thread), and MemoryBreakdownOf / ResetMemoryBreakdownPeak called there read and reset
// the account. In-process meshes (tests run each rank as a thread) open one per rank thread, so a
// rank's figures are what a process of its own would show. Scopes nest: an inner one replaces the
// outer one until it closes.
struct MemoryAccount;
class MemoryAccountScope {
 public:
  MemoryAccountScope();
  ~MemoryAccountScope();
  MemoryAccountScope(const MemoryAccountScope&) = delete;
  MemoryAccountScope& operator=(const MemoryAccountScope&) = delete;

 private:
  std::shared_ptr<MemoryAccount> previous_;
};

// One allocator per device. Thread-safe. Owned by the process (see CpuAllocator()).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr, size_t bytes) = 0;
  virtual MemoryStats Stats() const = 0;
  virtual void ResetPeak() = 0;
  virtual Device device() const = 0;
};

// The process-wide CPU allocator: 64-byte aligned blocks, counted. Thread-safe.
Allocator& CpuAllocator();
// The counting device's: counts as the CPU's does, hands out addresses that map nothing.
Allocator& CountingAllocator();
Allocator& AllocatorFor(Device device);

// A dense, row-major tensor. Copying a Tensor copies the reference, not the data.
class Tensor {
 public:
  Tensor() = default;
  static Tensor Empty(std::vector<int64_t> shape, ScalarType dtype, Device device = {});
  static Tensor Zeros(std::vector<int64_t> shape, ScalarType dtype, Device device = {});

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * ScalarTypeSize(dtype_); }
  ScalarType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool defined() const { return storage_ != nullptr; }

  void* raw() const { return static_cast<char*>(storage_->ptr) + offset_bytes_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // A view of `shape` starting `element_offset` elements into this tensor's data.
  Tensor View(int64_t element_offset, std::vector<int64_t> shape) const;
  void Fill(double value);
  std::string ShapeString() const;

 private:
  struct Storage {
    void* ptr = nullptr;
    size_t bytes = 0;
    Allocator* allocator = nullptr;
    MemoryKind kind = MemoryKind::kOther;
    std::shared_ptr<MemoryAccount> account;  // the creating thread's (MemoryAccountScope)
    ~Storage();
  };
  std::vector<int64_t> shape_;
  ScalarType dtype_ = ScalarType::kFloat32;
  Device device_;
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
};

template <typename T>
constexpr ScalarType ScalarTypeOf();
template <>
constexpr ScalarType ScalarTypeOf<float>() {
  return ScalarType::kFloat32;
}
template <>
constexpr ScalarType ScalarTypeOf<double>() {
  return ScalarType::kFloat64;
}
template <>
constexpr ScalarType ScalarTypeOf<int32_t>() {
  return ScalarType::kInt32;
}

}  // namespace meshrun
