// Tests for the safetensors reader/writer: round trips for every dtype, conversions, and corrupt
// headers (which must be errors, never crashes).
#include "engine/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace meshrun {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("meshrun_safetensors_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string Slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  fs::path dir_;
};

// A file from a raw header and data section.
std::string Craft(const std::string& header, const std::string& data, int64_t len = -1) {
  const uint64_t n = len < 0 ? header.size() : static_cast<uint64_t>(len);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, 7.0f};
  const std::vector<double> f64 = {1.0, -0.5, 1e300, 2.0};
  std::vector<uint16_t> bf16, f16;
  for (float v : f32) {
    bf16.push_back(FloatToBf16(v));
    f16.push_back(FloatToHalf(v));
  }
  const std::vector<int32_t> i32 = {-1, 2, std::numeric_limits<int32_t>::max()};
  const std::vector<int64_t> i64 = {-(int64_t{1} << 40), 5};
  const std::vector<uint16_t> u16 = {0, 65535, 50256, 1};
  const std::vector<uint8_t> u8 = {1, 0, 1};
  std::vector<TensorToWrite> tensors = {
      {"f32", DType::kF32, {2, 3}, f32.data()},    {"f64", DType::kF64, {4}, f64.data()},
      {"bf16", DType::kBF16, {3, 2}, bf16.data()}, {"f16", DType::kF16, {6}, f16.data()},
      {"i32", DType::kI32, {3}, i32.data()},       {"i64", DType::kI64, {1, 2}, i64.data()},
      {"u16", DType::kU16, {2, 2}, u16.data()},    {"bool", DType::kBool, {3}, u8.data()},
      {"empty", DType::kF32, {0, 4}, nullptr},     {"scalar", DType::kF32, {}, f32.data()},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "héllo \"q\""}};
  uint64_t bytes = 0;
  uint32_t crc = 0;
  const std::string path = Path("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, meta, &bytes, &crc).ok());
  EXPECT_EQ(bytes, fs::file_size(path));

  // The data section starts 8-byte aligned.
  const std::string raw = Slurp(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->metadata(), meta);
  EXPECT_EQ(file->names().front(), "f32");  // data-offset order = write order
  EXPECT_EQ(file->names().size(), tensors.size());

  std::vector<float> out(6);
  ASSERT_TRUE(file->ReadFloat("f32", out.data()).ok());
  EXPECT_EQ(out, f32);
  ASSERT_TRUE(file->ReadFloat("bf16", out.data()).ok());
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_NEAR(out[i], f32[i], std::abs(f32[i]) / 128);
  EXPECT_EQ(out[0], 1.5f);  // exactly representable
  ASSERT_TRUE(file->ReadFloat("f16", out.data()).ok());
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_NEAR(out[i], f32[i], std::abs(f32[i]) / 1024);
  ASSERT_TRUE(file->ReadFloat("f64", out.data()).ok());
  EXPECT_EQ(out[1], -0.5f);
  EXPECT_TRUE(std::isinf(out[2]));  // 1e300 does not fit a float
  ASSERT_TRUE(file->ReadFloat("scalar", out.data()).ok());
  EXPECT_EQ(out[0], 1.5f);

  auto info = file->Info("i64");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->dtype, DType::kI64);
  EXPECT_EQ(info->shape, (std::vector<int64_t>{1, 2}));
  std::vector<int64_t> i64_out(2);
  ASSERT_TRUE(file->ReadRaw("i64", i64_out.data(), 16).ok());
  EXPECT_EQ(i64_out, i64);
  std::vector<int32_t> i32_out(3);
  ASSERT_TRUE(file->ReadRaw("i32", i32_out.data(), 12).ok());
  EXPECT_EQ(i32_out, i32);
  std::vector<uint16_t> u16_out(4);
  ASSERT_TRUE(file->ReadRaw("u16", u16_out.data(), 8).ok());
  EXPECT_EQ(u16_out, u16);
  EXPECT_EQ(file->Info("empty")->num_elements(), 0);

  EXPECT_FALSE(file->ReadFloat("i32", out.data()).ok());       // not a float dtype
  EXPECT_FALSE(file->ReadRaw("i32", i32_out.data(), 8).ok());  // wrong size
  EXPECT_EQ(file->Info("nope").status().code(), StatusCode::kNotFound);

  std::vector<float> range(2);
  ASSERT_TRUE(file->ReadFloatRange("f32", 3, 2, range.data()).ok());
  EXPECT_EQ(range, (std::vector<float>{0.0f, 1e-3f}));
  ASSERT_TRUE(file->ReadFloatRange("bf16", 1, 2, range.data()).ok());
  EXPECT_EQ(range[1], 3.0f);
  EXPECT_FALSE(file->ReadFloatRange("f32", 5, 2, range.data()).ok());
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  const float x = 1;
  EXPECT_FALSE(
      WriteSafetensors(Path("a"), {{"a", DType::kF32, {1}, &x}, {"a", DType::kF32, {1}, &x}}, {})
          .ok());
  EXPECT_FALSE(WriteSafetensors(Path("b"), {{"__metadata__", DType::kF32, {1}, &x}}, {}).ok());
  EXPECT_FALSE(WriteSafetensors(Path("c"), {{"c", DType::kF32, {-1}, &x}}, {}).ok());
  EXPECT_FALSE(WriteSafetensors(Path("d"), {{"d", DType::kF32, {2}, nullptr}}, {}).ok());
  EXPECT_FALSE(fs::exists(Path("a")));
}

TEST(HalfTest, Conversions) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // rounds to inf
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  // Every finite half survives half → float → half.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;  // NaN payloads
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3F80);  // halfway between 0x3F80 and 0x3F81: to even
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}

TEST(SafetensorsCorruptTest, HeadersThatAreErrors) {
  const std::string data(16, '\0');
  const std::string good = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  ASSERT_TRUE(SafetensorsFile::FromBytes(Craft(good, data)).ok());

  struct Case {
    const char* what;
    std::string bytes;
  };
  const Case cases[] = {
      {"shorter than the length field", std::string("\x05\x00\x00", 3)},
      {"length beyond the file", Craft(good, data, good.size() + 100)},
      {"huge length", Craft(good, data, int64_t{1} << 62)},
      {"length below JSON", Craft(good, data, 1)},
      {"truncated data", Craft(good, data.substr(0, 10))},
      {"not JSON", Craft("{\"a\": nope}", data)},
      {"JSON array", Craft("[1, 2]", data)},
      {"overlap", Craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                           "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        data)},
      {"out of range", Craft(R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data)},
      {"begin > end", Craft(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", data)},
      {"wrong byte count",
       Craft(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data)},
      {"unknown dtype", Craft(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", data)},
      {"negative dim", Craft(R"({"a":{"dtype":"U8","shape":[-16],"data_offsets":[0,16]}})", data)},
      {"float dim", Craft(R"({"a":{"dtype":"U8","shape":[16.0],"data_offsets":[0,16]}})", data)},
      {"overflowing shape",
       Craft(R"({"a":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,16]}})",
             data)},
      {"missing offsets", Craft(R"({"a":{"dtype":"F32","shape":[4]}})", data)},
      {"three offsets",
       Craft(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16,16]}})", data)},
      {"duplicate name", Craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                   "a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                               data)},
      {"metadata not strings", Craft(R"({"__metadata__":{"k":1}})", data)},
      {"entry not an object", Craft(R"({"a":[1]})", data)},
      {"deep nesting", Craft(std::string(5000, '[') + std::string(5000, ']'), data)},
  };
  for (const Case& c : cases) {
    auto f = SafetensorsFile::FromBytes(c.bytes, c.what);
    EXPECT_FALSE(f.ok()) << c.what;
    if (!f.ok()) {
      EXPECT_NE(f.status().message().find(c.what), std::string::npos) << f.status().message();
    }
  }
}

TEST_F(SafetensorsTest, TruncatedFileOnDiskIsAnError) {
  const std::vector<float> v(100, 1.0f);
  const std::string path = Path("t.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"v", DType::kF32, {100}, v.data()}}, {}).ok());
  fs::resize_file(path, fs::file_size(path) - 4);
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find(path), std::string::npos);
  EXPECT_EQ(SafetensorsFile::Open(Path("missing")).status().code(), StatusCode::kNotFound);
}

// A small in-test fuzz: every truncation and many byte flips of a valid file are either parsed
// or rejected, never a crash (the sanitizer builds make this stricter).
TEST(SafetensorsCorruptTest, MutationsNeverCrash) {
  const std::string data(24, '\x01');
  const std::string valid =
      Craft(R"({"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            data);
  for (size_t n = 0; n < valid.size(); ++n) {
    auto f = SafetensorsFile::FromBytes(valid.substr(0, n));
    EXPECT_FALSE(f.ok()) << "truncated to " << n;
  }
  uint64_t state = 12345;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string bytes = valid;
    for (int k = 0; k < 3; ++k) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      bytes[(state >> 33) % bytes.size()] = static_cast<char>(state >> 56);
    }
    auto f = SafetensorsFile::FromBytes(bytes);
    if (!f.ok()) continue;
    std::vector<float> out(64);
    for (const std::string& name : f->names()) {
      auto info = f->Info(name);
      if (info.ok() && info->num_elements() <= 64 && IsFloatDType(info->dtype)) {
        (void)f->ReadFloat(name, out.data());
      }
    }
  }
}

}  // namespace
}  // namespace meshrun
