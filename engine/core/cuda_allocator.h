// The caching CUDA device allocator: blocks come from cudaMalloc once and are kept for reuse,
// because cudaMalloc/cudaFree synchronize the device. Counts allocated, peak and reserved bytes
// for meshrun_rank_memory_bytes (docs/metrics.md), like the CPU allocator in engine/core/tensor.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "common/status.h"
#include "engine/core/tensor.h"

namespace meshrun::gpu {

// One per device (CudaAllocator(device)). Thread-safe.
//
// Sizes are rounded up (512 bytes below 1 MiB, 2 MiB above) and a freed block goes to a free
// list; a request takes the smallest cached block that fits and is less than twice its size.
// Blocks are not split. Reuse is stream-unaware: a block freed while kernels still use it may
// be handed out again at once, which is safe when its users and its next owner run on the same
// stream (the engine runs every kernel on one compute stream; communication buffers are owned
// for the whole run). Out of memory: the cache is emptied and cudaMalloc retried once.
class CachingDeviceAllocator final : public Allocator {
 public:
  explicit CachingDeviceAllocator(int device) : device_(device) {}
  ~CachingDeviceAllocator() override;

  // RESOURCE_EXHAUSTED (with the sizes involved) when the device has no room left.
  StatusOr<void*> TryAllocate(size_t bytes);
  // Allocator interface: throws std::bad_alloc where TryAllocate fails.
  void* Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
  MemoryStats Stats() const override;
  void ResetPeak() override;
  Device device() const override { return Device{DeviceType::kCuda, device_}; }

  // Returns every cached (free) block to the driver. Synchronizes the device.
  void EmptyCache();

  static size_t RoundSize(size_t bytes);

 private:
  void EmptyCacheLocked();

  const int device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_blocks_;  // rounded size -> block
  std::unordered_map<void*, size_t> live_;    // block -> rounded size
  MemoryStats stats_;
};

// The process-wide allocator of `device` (created on first use, never destroyed).
CachingDeviceAllocator& CudaAllocator(int device);

// A device buffer owned by one object: move-only, freed to its allocator on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  static StatusOr<DeviceBuffer> Allocate(CachingDeviceAllocator& allocator, size_t bytes);

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  void Reset();

 private:
  CachingDeviceAllocator* allocator_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace meshrun::gpu
