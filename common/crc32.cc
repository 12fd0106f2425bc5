// CRC-32, slicing-by-8 (eight 256-entry tables; several GB/s, so checking a checkpoint costs
// little next to reading it).
#include "common/crc32.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/confined_file.h"

namespace meshrun {
namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

const Tables& CrcTables() {
  static const Tables tables = [] {
    Tables t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
    return t;
  }();
  return tables;
}

}  // namespace

uint32_t Crc32Update(uint32_t crc, const void* data, size_t size) {
  const Tables& t = CrcTables();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    // Byte-wise loads keep this independent of alignment and host byte order.
    const uint32_t lo =
        c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    p += 8;
    size -= 8;
  }
  while (size--) c = t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

StatusOr<FileDigest> DigestFile(const std::string& path) {
  MESHRUN_ASSIGN_OR_RETURN(const int fd, OpenConfined(path, O_RDONLY | O_CLOEXEC));
  if (fd < 0) return NotFoundError(path + ": cannot open: " + std::strerror(errno));
  FileDigest d;
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return DataLossError(path + ": read failed: " + std::strerror(err));
    }
    if (n == 0) break;
    d.crc32 = Crc32Update(d.crc32, buf.data(), static_cast<size_t>(n));
    d.bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return d;
}

}  // namespace meshrun
