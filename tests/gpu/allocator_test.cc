// The caching device allocator: size rounding, reuse of freed blocks, and the allocated / peak /
// reserved counters of docs/metrics.md.
#include <vector>

#include "engine/core/cuda_allocator.h"
#include "tests/gpu/gpu_test.h"

namespace meshrun {
namespace {

using gpu::CachingDeviceAllocator;

GPU_TEST(RoundsSizes) {
  EXPECT_TRUE(CachingDeviceAllocator::RoundSize(0) == 512);
  EXPECT_TRUE(CachingDeviceAllocator::RoundSize(1) == 512);
  EXPECT_TRUE(CachingDeviceAllocator::RoundSize(513) == 1024);
  EXPECT_TRUE(CachingDeviceAllocator::RoundSize(1 << 20) == (1 << 20));
  EXPECT_TRUE(CachingDeviceAllocator::RoundSize((1 << 20) + 1) == (2 << 20));
}

GPU_TEST(ReusesFreedBlocksAndCounts) {
  CachingDeviceAllocator alloc(0);
  ASSERT_OK_AND_ASSIGN(void* a, alloc.TryAllocate(3 << 20));
  MemoryStats s = alloc.Stats();
  EXPECT_TRUE(s.allocated_bytes == (4 << 20));
  EXPECT_TRUE(s.reserved_bytes == (4 << 20));
  EXPECT_TRUE(s.peak_bytes == (4 << 20));
  ASSERT_OK(gpu::ToStatus(cudaMemset(a, 1, 3 << 20), "cudaMemset", __FILE__, __LINE__));
  alloc.Free(a, 3 << 20);
  s = alloc.Stats();
  EXPECT_TRUE(s.allocated_bytes == 0);
  EXPECT_TRUE(s.reserved_bytes == (4 << 20));  // cached, not returned
  EXPECT_TRUE(s.peak_bytes == (4 << 20));

  ASSERT_OK_AND_ASSIGN(void* b, alloc.TryAllocate((3 << 20) + 5));  // same rounded size
  EXPECT_TRUE(b == a);
  EXPECT_TRUE(alloc.Stats().reserved_bytes == (4 << 20));
  ASSERT_OK_AND_ASSIGN(void* c, alloc.TryAllocate(100));
  EXPECT_TRUE(alloc.Stats().allocated_bytes == (4 << 20) + 512);
  EXPECT_TRUE(alloc.Stats().peak_bytes == (4 << 20) + 512);
  alloc.Free(b, 0);
  alloc.ResetPeak();
  EXPECT_TRUE(alloc.Stats().peak_bytes == 512);
  alloc.Free(c, 100);
  alloc.EmptyCache();
  s = alloc.Stats();
  EXPECT_TRUE(s.allocated_bytes == 0 && s.reserved_bytes == 0);
}

GPU_TEST(DoesNotReuseFarLargerBlocks) {
  CachingDeviceAllocator alloc(0);
  ASSERT_OK_AND_ASSIGN(void* big, alloc.TryAllocate(64 << 20));
  alloc.Free(big, 0);
  ASSERT_OK_AND_ASSIGN(void* small, alloc.TryAllocate(4 << 20));
  EXPECT_TRUE(small != big);
  EXPECT_TRUE(alloc.Stats().reserved_bytes == (68 << 20));
  alloc.Free(small, 0);
}

GPU_TEST(OutOfMemoryIsAStatus) {
  CachingDeviceAllocator alloc(0);
  auto p = alloc.TryAllocate(size_t{1} << 50);  // 1 PiB
  EXPECT_TRUE(!p.ok() && p.status().code() == StatusCode::kResourceExhausted);
  EXPECT_TRUE(alloc.Stats().allocated_bytes == 0);
}

GPU_TEST(DeviceBufferFreesOnDestruction) {
  CachingDeviceAllocator alloc(0);
  {
    ASSERT_OK_AND_ASSIGN(gpu::DeviceBuffer buf, gpu::DeviceBuffer::Allocate(alloc, 1000));
    EXPECT_TRUE(buf.get() != nullptr && buf.bytes() == 1000);
    EXPECT_TRUE(alloc.Stats().allocated_bytes == 1024);
    gpu::DeviceBuffer moved = std::move(buf);
    EXPECT_TRUE(buf.get() == nullptr && moved.get() != nullptr);
  }
  EXPECT_TRUE(alloc.Stats().allocated_bytes == 0);
}

}  // namespace
}  // namespace meshrun

GPU_TEST_MAIN()
