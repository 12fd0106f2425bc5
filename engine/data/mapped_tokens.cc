// MappedTokens: llm.c and nanoGPT token files mapped read-only, one or many shards.
#include "engine/data/mapped_tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/confined_file.h"
#include "engine/data/token_stream.h"

namespace meshrun {
namespace {

constexpr uint64_t kHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);

int32_t LeInt32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) |
                              (static_cast<uint32_t>(p[3]) << 24));
}

std::string Hex32(int32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", static_cast<uint32_t>(v));
  return buf;
}

}  // namespace

Status ParseTokenShard(const std::string& path, const std::string& format, uint64_t size,
                       const unsigned char* head, TokenShard* out) {
  out->path = path;
  out->format = format;
  if (format == "nanogpt") {
    if (size == 0) {
      return InvalidArgumentError(
          path + ": the file is empty (hint: point data at a non-empty token file)");
    }
    if (size % 2 != 0) {
      return InvalidArgumentError(path + ": " + std::to_string(size) +
                                  " bytes is an odd size (a stray byte at offset " +
                                  std::to_string(size - 1) +
                                  "); nanoGPT token files hold uint16 tokens (hint: the file is "
                                  "truncated or not a token file; for text use format text)");
    }
    out->width = 2;
    out->data_offset = 0;
    out->count = static_cast<int64_t>(size / 2);
    return OkStatus();
  }
  if (size < kHeaderBytes) {
    return InvalidArgumentError(path + ": short file: " + std::to_string(size) +
                                " bytes, but an llm.c token file starts with a " +
                                std::to_string(kHeaderBytes) +
                                "-byte header at offset 0 (hint: for raw uint16 tokens use format "
                                "nanogpt)");
  }
  const int32_t magic = LeInt32(head);
  const int32_t version = LeInt32(head + 4);
  const int32_t count = LeInt32(head + 8);
  if (magic != kLlmcMagic) {
    return InvalidArgumentError(path + ": bad magic " + std::to_string(magic) + " (" +
                                Hex32(magic) + ") at offset 0 of the llm.c header, expected " +
                                std::to_string(kLlmcMagic) + " (" + Hex32(kLlmcMagic) +
                                ") (hint: for raw uint16 tokens use format nanogpt, for text use "
                                "format text)");
  }
  if (version != kLlmcVersion && version != kLlmcVersionUint32) {
    return InvalidArgumentError(path + ": llm.c token file version " + std::to_string(version) +
                                " at offset 4 is not supported, expected " +
                                std::to_string(kLlmcVersion) + " (uint16 tokens) or " +
                                std::to_string(kLlmcVersionUint32) +
                                " (uint32 tokens) (hint: re-create it with meshrun tokenize)");
  }
  const int width = version == kLlmcVersionUint32 ? 4 : 2;
  if (count <= 0) {
    return InvalidArgumentError(path + ": the llm.c header says " + std::to_string(count) +
                                " tokens at offset 8; the shard is empty (hint: point data at "
                                "non-empty token files)");
  }
  const uint64_t body = size - kHeaderBytes;
  if (body % width != 0) {
    const uint64_t whole = body / width;
    return DataLossError(path + ": " + std::to_string(size) + " bytes is not the " +
                         std::to_string(kHeaderBytes) + "-byte header plus whole " +
                         std::to_string(width) + "-byte tokens: " + std::to_string(body % width) +
                         " stray byte(s) at offset " +
                         std::to_string(kHeaderBytes + whole * width) +
                         " (truncated, or not a token file) (hint: re-create or re-copy it)");
  }
  const uint64_t expected = kHeaderBytes + width * static_cast<uint64_t>(count);
  if (size != expected) {
    return DataLossError(path + ": the llm.c header says " + std::to_string(count) +
                         " tokens at offset 8 (" + std::to_string(expected) +
                         " bytes with the header) but the file has " + std::to_string(size) +
                         " bytes" +
                         (size < expected ? " (truncated) (hint: re-create or re-copy it)"
                                          : " (hint: re-create or re-copy it)"));
  }
  out->width = width;
  out->data_offset = kHeaderBytes;
  out->count = count;
  return OkStatus();
}

StatusOr<std::shared_ptr<const MappedTokens>> MappedTokens::Open(
    const std::vector<std::string>& files, const std::vector<std::string>& formats) {
  std::shared_ptr<MappedTokens> m(new MappedTokens());
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& path = files[i];
    MESHRUN_ASSIGN_OR_RETURN(int fd, OpenConfined(path, O_RDONLY));
    if (fd < 0) {
      return NotFoundError(path + ": cannot open for reading: " + std::strerror(errno) +
                           " (hint: check the path and its permissions)");
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return InvalidArgumentError(path + ": not a regular file (hint: point data at token files)");
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    unsigned char head[kHeaderBytes] = {};
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size, kHeaderBytes));
    if (want > 0 && ::pread(fd, head, want, 0) != static_cast<ssize_t>(want)) {
      const int err = errno;
      ::close(fd);
      return DataLossError(path + ": cannot read the first " + std::to_string(want) +
                           " bytes at offset 0: " + std::strerror(err));
    }
    TokenShard shard;
    if (Status s = ParseTokenShard(path, formats[i], size, head, &shard); !s.ok()) {
      ::close(fd);
      return s;
    }
    void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (base == MAP_FAILED) {
      return InternalError(path + ": cannot map " + std::to_string(size) +
                           " bytes: " + std::strerror(err));
    }
    shard.base = static_cast<const unsigned char*>(base);
    shard.map_bytes = size;
    shard.first = m->size_;
    m->size_ += shard.count;
    m->width_max_id_ =
        std::max<int64_t>(m->width_max_id_, shard.width == 4 ? 0xFFFFFFFFll : 0xFFFF);
    m->shards_.push_back(std::move(shard));
  }
  return std::shared_ptr<const MappedTokens>(std::move(m));
}

MappedTokens::~MappedTokens() {
  for (const TokenShard& s : shards_) {
    if (s.base) ::munmap(const_cast<unsigned char*>(s.base), s.map_bytes);
  }
}

Status MappedTokens::Read(int64_t begin, int64_t count, int32_t* out, int32_t id_limit) const {
  if (begin < 0 || count < 0 || begin > size_ || count > size_ - begin) {
    return OutOfRangeError("tokens [" + std::to_string(begin) + ", " +
                           std::to_string(begin + count) + ") lie outside a stream of " +
                           std::to_string(size_) + " tokens");
  }
  // The shard holding `begin`: the last whose first token is at or before it.
  auto it = std::upper_bound(shards_.begin(), shards_.end(), begin,
                             [](int64_t b, const TokenShard& s) { return b < s.first; });
  size_t k = static_cast<size_t>(it - shards_.begin()) - 1;
  int64_t done = 0;
  while (done < count) {
    const TokenShard& s = shards_[k];
    const int64_t at = begin + done - s.first;
    const int64_t n = std::min(count - done, s.count - at);
    const unsigned char* p = s.base + s.data_offset + static_cast<uint64_t>(at) * s.width;
    for (int64_t i = 0; i < n; ++i, p += s.width) {
      uint32_t t = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
      if (s.width == 4) {
        t |= (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
      }
      if (t > 0x7FFFFFFFu || (id_limit > 0 && t >= static_cast<uint32_t>(id_limit))) {
        const uint64_t offset = s.data_offset + static_cast<uint64_t>(at + i) * s.width;
        return InvalidArgumentError(
            "model.vocab_size: token id " + std::to_string(t) + " at offset " +
            std::to_string(offset) + " of " + s.path + " is not below vocab_size(" +
            (id_limit > 0 ? std::to_string(id_limit) : std::string("2147483648")) +
            ") (hint: raise model.vocab_size or use data tokenized with a smaller vocabulary)");
      }
      out[done + i] = static_cast<int32_t>(t);
    }
    done += n;
    ++k;
  }
  return OkStatus();
}

// ---- mask files (flags beside token files).

std::string MaskPathOf(const std::string& token_path) {
  const size_t slash = token_path.find_last_of('/');
  const size_t dot = token_path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return token_path + ".mask";
  }
  return token_path.substr(0, dot) + ".mask";
}

StatusOr<std::shared_ptr<const MappedFlags>> MappedFlags::Open(
    const std::vector<std::string>& files, const std::vector<int64_t>& counts) {
  std::shared_ptr<MappedFlags> m(new MappedFlags());
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& path = files[i];
    MESHRUN_ASSIGN_OR_RETURN(int fd, OpenConfined(path, O_RDONLY));
    if (fd < 0) {
      return NotFoundError(path + ": cannot open for reading: " + std::strerror(errno) +
                           " (hint: check the path and its permissions)");
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return InvalidArgumentError(path +
                                  ": not a regular file (hint: remove it, or write it "
                                  "again with meshrun tokenize --template)");
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    unsigned char head[kMaskHeaderBytes] = {};
    if (size < static_cast<uint64_t>(kMaskHeaderBytes) ||
        ::pread(fd, head, kMaskHeaderBytes, 0) != kMaskHeaderBytes ||
        std::memcmp(head, kMaskMagic, sizeof(kMaskMagic)) != 0 || LeInt32(head + 8) != 1) {
      ::close(fd);
      return InvalidArgumentError(path +
                                  ": not a meshrun mask file (magic MRMASK01, version 1 at "
                                  "offset 0) (hint: write it again with meshrun tokenize "
                                  "--template, or remove it)");
    }
    const int64_t want = counts[i];
    if (size != static_cast<uint64_t>(kMaskHeaderBytes + want)) {
      ::close(fd);
      return InvalidArgumentError(
          path + ": holds " + std::to_string(static_cast<int64_t>(size) - kMaskHeaderBytes) +
          " flags after its header but its token file has " + std::to_string(want) +
          " tokens (hint: write the token and mask files again with meshrun tokenize)");
    }
    const int seq_len = LeInt32(head + 12);
    if (i > 0 && seq_len != m->seq_len_) {
      ::close(fd);
      return InvalidArgumentError(path + ": laid out for seq_len " + std::to_string(seq_len) +
                                  ", the shards before it for " + std::to_string(m->seq_len_) +
                                  " (hint: tokenize every shard with the same --seq-len)");
    }
    m->seq_len_ = seq_len;
    void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (base == MAP_FAILED) {
      return InternalError(path + ": cannot map " + std::to_string(size) +
                           " bytes: " + std::strerror(err));
    }
    Part part;
    part.path = path;
    part.base = static_cast<const unsigned char*>(base);
    part.map_bytes = size;
    part.first = m->size_;
    part.count = want;
    m->size_ += want;
    m->parts_.push_back(std::move(part));
  }
  return std::shared_ptr<const MappedFlags>(std::move(m));
}

MappedFlags::~MappedFlags() {
  for (const Part& p : parts_) {
    if (p.base) ::munmap(const_cast<unsigned char*>(p.base), p.map_bytes);
  }
}

Status MappedFlags::Read(int64_t begin, int64_t count, uint8_t* out) const {
  if (begin < 0 || count < 0 || begin > size_ || count > size_ - begin) {
    return OutOfRangeError("flags [" + std::to_string(begin) + ", " +
                           std::to_string(begin + count) + ") lie outside a stream of " +
                           std::to_string(size_) + " tokens");
  }
  auto it = std::upper_bound(parts_.begin(), parts_.end(), begin,
                             [](int64_t b, const Part& p) { return b < p.first; });
  size_t k = static_cast<size_t>(it - parts_.begin()) - 1;
  int64_t done = 0;
  while (done < count) {
    const Part& p = parts_[k];
    const int64_t at = begin + done - p.first;
    const int64_t n = std::min(count - done, p.count - at);
    std::memcpy(out + done, p.base + kMaskHeaderBytes + at, static_cast<size_t>(n));
    done += n;
    ++k;
  }
  return OkStatus();
}

}  // namespace meshrun
