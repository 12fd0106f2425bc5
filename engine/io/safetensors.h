// Reader and writer for the safetensors format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the raw little-endian tensor data. Used for checkpoint shards, `meshrun export`, and
// loading Hugging Face GPT-2 weights.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshrun {

namespace safetensors_internal {
class ByteSource;  // an open file or a buffer in memory (safetensors.cc)
}  // namespace safetensors_internal

// Element types with their safetensors names. Float types convert to float on read.
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU64, kU32, kU16, kU8, kBool };

const char* DTypeName(DType dtype);  // "F32", "BF16", ...
StatusOr<DType> ParseDType(std::string_view name);
size_t DTypeSize(DType dtype);
bool IsFloatDType(DType dtype);  // F64, F32, F16, BF16

// IEEE half and bfloat16 conversions (round to nearest even; NaN stays NaN).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}
uint16_t FloatToBf16(float f);

// Where one tensor lies in a file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;

  int64_t num_elements() const;
  uint64_t num_bytes() const { return end - begin; }
};

// A tensor to write: `data` points to num_elements × DTypeSize(dtype) little-endian bytes
// (host order on the x86 / ARM machines we run on) that must stay valid during the write.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// An open safetensors file: the validated header in memory, tensor data read on demand with
// pread (no mmap, so a file truncated under us is an error, not a SIGBUS). Immutable after Open
// and thread-safe for reads. Copies share the open file.
class SafetensorsFile {
 public:
  // Reads and validates the header: N within the file, JSON an object, every entry a known
  // dtype with a non-negative shape whose byte size equals its data_offsets range, ranges
  // inside the data section and not overlapping, metadata string→string, names unique.
  // Corrupt input is DATA_LOSS (or INVALID_ARGUMENT for an unsupported dtype), never a crash.
  static StatusOr<SafetensorsFile> Open(const std::string& path);
  // The same over bytes in memory (`label` names the source in errors); used by the fuzz target.
  static StatusOr<SafetensorsFile> FromBytes(std::string bytes, std::string label = "<memory>");

  const std::string& path() const { return path_; }
  // Tensor names in the order of their data offsets.
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(const std::string& name) const { return index_.count(name) > 0; }
  StatusOr<TensorInfo> Info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return file_size_; }

  // All elements of a float tensor (F32, F64, BF16, F16) converted to float; `out` holds
  // num_elements floats. INVALID_ARGUMENT for other dtypes.
  Status ReadFloat(const std::string& name, float* out) const;
  // Elements [first, first + count) (row-major order) of a float tensor, converted to float.
  Status ReadFloatRange(const std::string& name, int64_t first, int64_t count, float* out) const;
  // The raw bytes of a tensor of any dtype; `size` must equal its byte size.
  Status ReadRaw(const std::string& name, void* out, size_t size) const;

 private:
  using ByteSource = safetensors_internal::ByteSource;
  static StatusOr<SafetensorsFile> Parse(std::shared_ptr<const ByteSource> source,
                                         std::string path);
  Status ReadAt(uint64_t data_offset, void* out, size_t size) const;

  std::string path_;
  std::shared_ptr<const ByteSource> source_;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;  // 8 + N
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file atomically (temporary + fsync + rename): tensors in the given order,
// laid out back to back; the JSON header is padded with spaces so the data starts at an 8-byte
// boundary. INVALID_ARGUMENT for empty or duplicate names, "__metadata__" as a name, negative
// dims or null data. `bytes_written` and `crc32` (optional) describe the final file.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        uint64_t* bytes_written = nullptr, uint32_t* crc32 = nullptr);

}  // namespace meshrun
