// CRC-32 (the zlib / PNG / gzip polynomial 0xEDB88320) for checkpoint integrity checks: the
// value matches `zlib.crc32` and `binascii.crc32` in Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace meshrun {

// Continues a CRC: Crc32Update(Crc32Update(0, a), b) == CRC of a followed by b. Start from 0.
uint32_t Crc32Update(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32(const void* data, size_t size) {
  return Crc32Update(0, data, size);
}

struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// Size and CRC-32 of a whole file, read in chunks. NOT_FOUND when it cannot be opened.
StatusOr<FileDigest> DigestFile(const std::string& path);

}  // namespace meshrun
