// Where the counting device's buffers live (DeviceType::kCount, tensor.h): a range of addresses
// no process maps (non-canonical on x86-64 and aarch64), so that a dereference faults at once.
// Header-only, so the counting backend (engine/comm) tells them from host buffers without
// linking the tensors.
#pragma once

#include <cstdint>

namespace meshrun {

inline constexpr uint64_t kCountedAddressBase = 0x4000'0000'0000'0000ull;
inline constexpr uint64_t kCountedAddressSpan = 0x1000'0000'0000'0000ull;

// True for an address of a counting-device buffer, inside one or just past its end (buffers
// are handed out from the start of the range and never past its end, nor reused).
inline bool IsCountedAddress(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a >= kCountedAddressBase && a <= kCountedAddressBase + kCountedAddressSpan;
}

}  // namespace meshrun
