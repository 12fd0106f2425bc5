// safetensors: header validation (every corrupt input is an error, never a crash), on-demand
// reads with dtype conversion, and the atomic writer.
#include "engine/io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "common/atomic_file.h"
#include "common/confined_file.h"

namespace meshrun {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping here");

namespace {

using nlohmann::json;

// The reference implementation's bound; a larger header is corrupt or hostile.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The header is at most two levels deep ({"t": {"shape": [..]}}); deeper nesting is corrupt, and
// refusing it early keeps a hostile header from costing deep recursion in the JSON library.
constexpr int kMaxJsonDepth = 8;

struct DTypeEntry {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU64, "U64", 8},
    {DType::kU32, "U32", 4},   {DType::kU16, "U16", 2}, {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

void WriteLe64(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t ReadLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Maximum nesting depth of the JSON text, ignoring brackets inside strings.
int JsonDepth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

// Number of elements of `shape`, or an error when a dim is invalid or the product overflows.
StatusOr<uint64_t> CheckedElements(const std::vector<int64_t>& shape, const std::string& where) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgumentError(where + ": negative dim " + std::to_string(d));
    if (d != 0 && n > (uint64_t{1} << 62) / static_cast<uint64_t>(d)) {
      return DataLossError(where + ": the shape's element count overflows");
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += i ? "," : "";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

// ---- dtypes and conversions -------------------------------------------------------------

const char* DTypeName(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return InvalidArgumentError("unsupported safetensors dtype '" + std::string(name) +
                              "' (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 "
                              "BOOL)");
}

size_t DTypeSize(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

bool IsFloatDType(DType dtype) {
  return dtype == DType::kF64 || dtype == DType::kF32 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    // Zero or subnormal: mant · 2^-24, exact in float.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  uint32_t mant = x & 0x7FFFFF;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xFF);
  if (exp == 0xFF) {  // inf, or NaN (kept quiet and non-zero)
    return static_cast<uint16_t>(sign | 0x7C00 | (mant ? 0x200 | (mant >> 13) : 0));
  }
  const int32_t e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00);  // overflow → inf
  if (e <= 0) {                                              // subnormal half, or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - e;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;  // may carry into the exponent
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry up to inf: correct
  return static_cast<uint16_t>(half);
}

uint16_t FloatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  return static_cast<uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- reading ----------------------------------------------------------------------------

namespace safetensors_internal {

// Random access to a file's bytes. Implementations are immutable and thread-safe.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Exactly `n` bytes at `offset`, or an error (e.g. the file shrank since it was opened).
  virtual Status ReadAt(uint64_t offset, void* out, size_t n) const = 0;
};

}  // namespace safetensors_internal

namespace {

using safetensors_internal::ByteSource;

class FdSource : public ByteSource {
 public:
  FdSource(int fd, uint64_t size, std::string path)
      : fd_(fd), size_(size), path_(std::move(path)) {}
  ~FdSource() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  Status ReadAt(uint64_t offset, void* out, size_t n) const override {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        return DataLossError(path_ + ": read at byte " + std::to_string(offset) +
                             " failed: " + std::strerror(errno));
      }
      if (got == 0) {
        return DataLossError(path_ + ": unexpected end of file at byte " + std::to_string(offset) +
                             " (the file was truncated while open)");
      }
      p += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
    return OkStatus();
  }

 private:
  int fd_;
  uint64_t size_;
  std::string path_;
};

class MemorySource : public ByteSource {
 public:
  explicit MemorySource(std::string bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  Status ReadAt(uint64_t offset, void* out, size_t n) const override {
    if (offset > bytes_.size() || n > bytes_.size() - offset) {
      return DataLossError("read past the end of the buffer");
    }
    if (n) std::memcpy(out, bytes_.data() + offset, n);
    return OkStatus();
  }

 private:
  std::string bytes_;
};

// Converts `count` elements of a float dtype at `src` to float.
void ConvertToFloat(DType dtype, const unsigned char* src, int64_t count, float* out) {
  switch (dtype) {
    case DType::kF32: std::memcpy(out, src, static_cast<size_t>(count) * 4); break;
    case DType::kF64:
      for (int64_t i = 0; i < count; ++i) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        out[i] = Bf16ToFloat(static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8)));
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        out[i] = HalfToFloat(static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8)));
      }
      break;
    default: break;  // callers check IsFloatDType
  }
}

}  // namespace

StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  MESHRUN_ASSIGN_OR_RETURN(const int fd, OpenConfined(path, O_RDONLY | O_CLOEXEC));
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFoundError(path + ": no such file");
    return NotFoundError(path + ": cannot open: " + std::strerror(err));
  }
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size < 0) {
    const int err = errno;
    ::close(fd);
    return InternalError(path + ": cannot determine the file size: " + std::strerror(err));
  }
  return Parse(std::make_shared<FdSource>(fd, static_cast<uint64_t>(size), path), path);
}

StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::string bytes, std::string label) {
  return Parse(std::make_shared<MemorySource>(std::move(bytes)), std::move(label));
}

StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::shared_ptr<const ByteSource> source,
                                                 std::string path) {
  const uint64_t file_size = source->size();
  auto corrupt = [&](const std::string& what) {
    return DataLossError(path + ": not a valid safetensors file: " + what +
                         " (hint: the file is corrupt or truncated; re-create or re-download it)");
  };
  if (file_size < 8) {
    return corrupt("only " + std::to_string(file_size) + " bytes, less than the 8-byte header " +
                   "length");
  }
  unsigned char len_bytes[8];
  MESHRUN_RETURN_IF_ERROR(source->ReadAt(0, len_bytes, 8));
  const uint64_t header_len = ReadLe64(len_bytes);
  if (header_len < 2 || header_len > kMaxHeaderBytes || header_len > file_size - 8) {
    return corrupt("header length " + std::to_string(header_len) + " does not fit a " +
                   std::to_string(file_size) + "-byte file");
  }
  std::string header(static_cast<size_t>(header_len), '\0');
  MESHRUN_RETURN_IF_ERROR(source->ReadAt(8, header.data(), header.size()));
  if (JsonDepth(header) > kMaxJsonDepth) return corrupt("the JSON header is nested too deeply");

  // Duplicate top-level keys would silently shadow each other in the parsed object; catch them
  // while parsing.
  std::set<std::string> keys;
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!keys.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json root = json::parse(header, on_event, /*allow_exceptions=*/false);
  if (root.is_discarded()) return corrupt("the header is not valid JSON");
  if (!root.is_object()) return corrupt("the JSON header is not an object");
  if (!duplicate.empty()) return corrupt("tensor '" + duplicate + "' appears twice");

  SafetensorsFile f;
  f.path_ = path;
  f.file_size_ = file_size;
  f.data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - f.data_start_;
  std::vector<TensorInfo> infos;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return corrupt("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) return corrupt("__metadata__['" + k + "'] is not a string");
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object()) return corrupt(where + " is not an object");
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
      return corrupt(where + " has no string 'dtype'");
    }
    if (shape_it == entry.end() || !shape_it->is_array()) {
      return corrupt(where + " has no array 'shape'");
    }
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      return corrupt(where + " has no 'data_offsets' pair");
    }
    TensorInfo info;
    info.name = name;
    auto dtype = ParseDType(dtype_it->get<std::string>());
    if (!dtype.ok())
      return InvalidArgumentError(path + ": " + where + ": " + dtype.status().message());
    info.dtype = *dtype;
    for (const auto& d : *shape_it) {
      if (!d.is_number_unsigned())
        return corrupt(where + " has a shape entry that is not a non-negative integer");
      const uint64_t v = d.get<uint64_t>();
      if (v > (uint64_t{1} << 62)) return corrupt(where + " has a dim that is too large");
      info.shape.push_back(static_cast<int64_t>(v));
    }
    for (const auto& o : *offsets_it) {
      if (!o.is_number_unsigned())
        return corrupt(where + " has a data offset that is not a non-negative integer");
    }
    info.begin = (*offsets_it)[0].get<uint64_t>();
    info.end = (*offsets_it)[1].get<uint64_t>();
    if (info.begin > info.end || info.end > data_size) {
      return corrupt(where + " has data_offsets [" + std::to_string(info.begin) + ", " +
                     std::to_string(info.end) + "] outside the " + std::to_string(data_size) +
                     "-byte data section");
    }
    auto elements = CheckedElements(info.shape, path + ": " + where);
    if (!elements.ok()) return corrupt(where + " has an invalid shape " + ShapeString(info.shape));
    const uint64_t esize = DTypeSize(info.dtype);
    if (*elements > (uint64_t{1} << 62) / esize || *elements * esize != info.end - info.begin) {
      return corrupt(where + " (" + DTypeName(info.dtype) + ShapeString(info.shape) + ") needs " +
                     std::to_string(*elements * esize) + " bytes but data_offsets span " +
                     std::to_string(info.end - info.begin));
    }
    infos.push_back(std::move(info));
  }
  std::sort(infos.begin(), infos.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& info : infos) {
    if (info.begin == info.end) continue;  // empty tensors occupy no bytes
    if (prev && info.begin < prev->end) {
      return corrupt("tensors '" + prev->name + "' and '" + info.name + "' overlap");
    }
    prev = &info;
  }
  for (TensorInfo& info : infos) {
    f.names_.push_back(info.name);
    f.index_.emplace(info.name, std::move(info));
  }
  f.source_ = std::move(source);
  return f;
}

StatusOr<TensorInfo> SafetensorsFile::Info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) return NotFoundError(path_ + ": no tensor '" + name + "'");
  return it->second;
}

Status SafetensorsFile::ReadAt(uint64_t data_offset, void* out, size_t size) const {
  return source_->ReadAt(data_start_ + data_offset, out, size);
}

Status SafetensorsFile::ReadRaw(const std::string& name, void* out, size_t size) const {
  MESHRUN_ASSIGN_OR_RETURN(TensorInfo info, Info(name));
  if (size != info.num_bytes()) {
    return InvalidArgumentError(path_ + ": tensor '" + name + "' has " +
                                std::to_string(info.num_bytes()) + " bytes, the buffer " +
                                std::to_string(size));
  }
  return ReadAt(info.begin, out, size);
}

Status SafetensorsFile::ReadFloat(const std::string& name, float* out) const {
  MESHRUN_ASSIGN_OR_RETURN(TensorInfo info, Info(name));
  return ReadFloatRange(name, 0, info.num_elements(), out);
}

Status SafetensorsFile::ReadFloatRange(const std::string& name, int64_t first, int64_t count,
                                       float* out) const {
  MESHRUN_ASSIGN_OR_RETURN(TensorInfo info, Info(name));
  if (!IsFloatDType(info.dtype)) {
    return InvalidArgumentError(path_ + ": tensor '" + name + "' is " + DTypeName(info.dtype) +
                                ", not a float type (F32, F64, BF16, F16)");
  }
  const int64_t n = info.num_elements();
  if (first < 0 || count < 0 || first > n || count > n - first) {
    return OutOfRangeError(path_ + ": elements [" + std::to_string(first) + ", " +
                           std::to_string(first + count) + ") of tensor '" + name + "' with " +
                           std::to_string(n) + " elements");
  }
  const size_t esize = DTypeSize(info.dtype);
  const uint64_t offset = info.begin + static_cast<uint64_t>(first) * esize;
  if (info.dtype == DType::kF32) return ReadAt(offset, out, static_cast<size_t>(count) * 4);
  // Convert in bounded chunks so a large bf16 tensor does not need a second full-size buffer.
  constexpr int64_t kChunk = 1 << 20;
  std::vector<unsigned char> buf(static_cast<size_t>(std::min(count, kChunk)) * esize);
  for (int64_t done = 0; done < count;) {
    const int64_t m = std::min(kChunk, count - done);
    MESHRUN_RETURN_IF_ERROR(ReadAt(offset + static_cast<uint64_t>(done) * esize, buf.data(),
                                   static_cast<size_t>(m) * esize));
    ConvertToFloat(info.dtype, buf.data(), m, out + done);
    done += m;
  }
  return OkStatus();
}

// ---- writing ----------------------------------------------------------------------------

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata, uint64_t* bytes_written,
                        uint32_t* crc32) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string where = path + ": tensor '" + t.name + "'";
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgumentError(where + ": invalid tensor name");
    }
    if (header.contains(t.name)) return InvalidArgumentError(where + " is given twice");
    MESHRUN_ASSIGN_OR_RETURN(uint64_t elements, CheckedElements(t.shape, where));
    const uint64_t size = elements * DTypeSize(t.dtype);
    if (size > 0 && t.data == nullptr) return InvalidArgumentError(where + ": no data");
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + size}}};
    sizes.push_back(size);
    offset += size;
  }
  std::string text = header.dump();
  // The format allows trailing spaces in the header; pad so the data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');

  MESHRUN_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  unsigned char len[8];
  WriteLe64(text.size(), len);
  MESHRUN_RETURN_IF_ERROR(w.Append(len, 8));
  MESHRUN_RETURN_IF_ERROR(w.Append(text));
  for (size_t i = 0; i < tensors.size(); ++i) {
    MESHRUN_RETURN_IF_ERROR(w.Append(tensors[i].data, sizes[i]));
  }
  const uint64_t total = w.bytes_written();
  const uint32_t crc = w.crc32();
  MESHRUN_RETURN_IF_ERROR(w.Commit());
  if (bytes_written) *bytes_written = total;
  if (crc32) *crc32 = crc;
  return OkStatus();
}

}  // namespace meshrun
