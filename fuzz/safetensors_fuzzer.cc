// Fuzz target: the safetensors reader (engine/io/safetensors.h) on arbitrary bytes.
// Properties: SafetensorsFile::FromBytes never crashes; corrupt input is DATA_LOSS or
// INVALID_ARGUMENT; for an accepted file every listed tensor has Info, its byte range lies in
// the file and matches its shape, ReadRaw reads it, and float tensors convert (ReadFloat and
// ReadFloatRange agree) -- so no later read of an accepted header goes out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using meshrun::StatusCode;
  auto file = meshrun::SafetensorsFile::FromBytes(
      std::string(reinterpret_cast<const char*>(data), size), "<fuzz>");
  if (!file.ok()) {
    const StatusCode code = file.status().code();
    FUZZ_CHECK(code == StatusCode::kDataLoss || code == StatusCode::kInvalidArgument,
               file.status().message());
    return 0;
  }
  FUZZ_CHECK(file->file_size() == size, "");
  uint64_t total = 0;
  for (const std::string& name : file->names()) {
    FUZZ_CHECK(file->Contains(name), name);
    auto info = file->Info(name);
    FUZZ_CHECK(info.ok(), info.status().message());
    FUZZ_CHECK(info->begin <= info->end && info->end <= size, name);
    const int64_t n = info->num_elements();
    FUZZ_CHECK(n >= 0, name);
    FUZZ_CHECK(static_cast<uint64_t>(n) * meshrun::DTypeSize(info->dtype) == info->num_bytes(),
               name);
    total += info->num_bytes();
    FUZZ_CHECK(total <= size, "tensors hold more bytes than the file");
    std::vector<char> raw(info->num_bytes());
    const meshrun::Status read = file->ReadRaw(name, raw.data(), raw.size());
    FUZZ_CHECK(read.ok(), read.message());
    if (raw.size() >= 1) {
      const meshrun::Status wrong = file->ReadRaw(name, raw.data(), raw.size() - 1);
      FUZZ_CHECK(!wrong.ok(), "ReadRaw accepted a short buffer");
    }
    if (meshrun::IsFloatDType(info->dtype)) {
      std::vector<float> all(static_cast<size_t>(n));
      const meshrun::Status s = file->ReadFloat(name, all.data());
      FUZZ_CHECK(s.ok(), s.message());
      if (n > 0) {
        const int64_t first = n / 3, count = n - first;
        std::vector<float> part(static_cast<size_t>(count));
        const meshrun::Status r = file->ReadFloatRange(name, first, count, part.data());
        FUZZ_CHECK(r.ok(), r.message());
        FUZZ_CHECK(std::memcmp(part.data(), all.data() + first, count * sizeof(float)) == 0, name);
        FUZZ_CHECK(!file->ReadFloatRange(name, first, count + 1, part.data()).ok(),
                   "ReadFloatRange past the end of " + name);
      }
    } else {
      float dummy = 0;
      FUZZ_CHECK(!file->ReadFloat(name, &dummy).ok(), "ReadFloat of a non-float tensor");
    }
  }
  FUZZ_CHECK(!file->Info("__metadata__").ok(), "");
  return 0;
}
