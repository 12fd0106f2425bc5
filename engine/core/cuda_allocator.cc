// The caching device allocator and DeviceBuffer.
#include "engine/core/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <array>
#include <memory>
#include <new>
#include <string>

namespace meshrun::gpu {
namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;  // 2 MiB

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

}  // namespace

size_t CachingDeviceAllocator::RoundSize(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t r = bytes <= kSmallLimit ? kSmallRound : kLargeRound;
  return (bytes + r - 1) / r * r;
}

CachingDeviceAllocator::~CachingDeviceAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

StatusOr<void*> CachingDeviceAllocator::TryAllocate(size_t bytes) {
  const size_t size = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* ptr = nullptr;
  auto it = free_blocks_.lower_bound(size);
  if (it != free_blocks_.end() && it->first < 2 * size) {
    ptr = it->second;
    const size_t block = it->first;
    free_blocks_.erase(it);
    live_[ptr] = block;
    stats_.allocated_bytes += static_cast<int64_t>(block);
  } else {
    DeviceGuard guard(device_);
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      EmptyCacheLocked();
      err = cudaMalloc(&ptr, size);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return Status(
          err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal,
          "cudaMalloc of " + std::to_string(size) + " bytes on cuda:" + std::to_string(device_) +
              " failed (" + cudaGetErrorString(err) + "); allocated " +
              std::to_string(stats_.allocated_bytes) + " bytes, reserved " +
              std::to_string(stats_.reserved_bytes) + " (hint: lower micro_batch_size or seq_len)");
    }
    live_[ptr] = size;
    stats_.allocated_bytes += static_cast<int64_t>(size);
    stats_.reserved_bytes += static_cast<int64_t>(size);
  }
  if (stats_.allocated_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.allocated_bytes;
  return ptr;
}

void* CachingDeviceAllocator::Allocate(size_t bytes) {
  StatusOr<void*> p = TryAllocate(bytes);
  if (!p.ok()) throw std::bad_alloc();
  return *p;
}

void CachingDeviceAllocator::Free(void* ptr, size_t /*bytes*/) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours: a broken invariant, but never free foreign memory
  const size_t size = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= static_cast<int64_t>(size);
  free_blocks_.emplace(size, ptr);
}

MemoryStats CachingDeviceAllocator::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingDeviceAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.allocated_bytes;
}

void CachingDeviceAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

void CachingDeviceAllocator::EmptyCacheLocked() {
  if (free_blocks_.empty()) return;
  DeviceGuard guard(device_);
  for (const auto& [size, ptr] : free_blocks_) {
    (void)cudaFree(ptr);  // synchronizes: kernels still using a cached block finish first
    stats_.reserved_bytes -= static_cast<int64_t>(size);
  }
  free_blocks_.clear();
}

CachingDeviceAllocator& CudaAllocator(int device) {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static std::array<CachingDeviceAllocator*, kMaxDevices> allocators{};  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  const int d = device < 0 || device >= kMaxDevices ? 0 : device;
  if (allocators[d] == nullptr) allocators[d] = new CachingDeviceAllocator(d);
  return *allocators[d];
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    allocator_ = o.allocator_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.allocator_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(CachingDeviceAllocator& allocator, size_t bytes) {
  MESHRUN_ASSIGN_OR_RETURN(void* ptr, allocator.TryAllocate(bytes));
  DeviceBuffer b;
  b.allocator_ = &allocator;
  b.ptr_ = ptr;
  b.bytes_ = bytes;
  return b;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr && allocator_ != nullptr) allocator_->Free(ptr_, bytes_);
  allocator_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace meshrun::gpu
