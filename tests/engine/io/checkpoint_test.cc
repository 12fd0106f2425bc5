// Tests for sharded checkpoints: round trips under several splits, resharded reads,
// completeness (truncated, missing, corrupt shards; missing metadata), fallback and pruning.
#include "engine/io/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>

namespace meshrun {
namespace {

namespace fs = std::filesystem;

// Tensors of the test model: w [8, 12] and v [4, 8, 2] hold their row-major index (split along
// dim 0 or 1 by 2 or 4 ranks), b [6] and scalar [] are replicated.
const std::map<std::string, std::vector<int64_t>> kShapes = {
    {"w", {8, 12}}, {"v", {4, 8, 2}}, {"b", {6}}, {"scalar", {}}};

std::vector<float> Full(const std::vector<int64_t>& shape, float base) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), base);
  return v;
}

// The hyper-rectangle [offset, offset + shape) of a row-major tensor.
std::vector<float> Cut(const std::vector<float>& full, const std::vector<int64_t>& global,
                       const std::vector<int64_t>& offset, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> out;
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t lin = 0;
    for (size_t d = 0; d < shape.size(); ++d) lin = lin * global[d] + offset[d] + idx[d];
    out.push_back(full[lin]);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("meshrun_checkpoint_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const auto& [name, shape] : kShapes) full_[name] = Full(shape, name == "v" ? 1000 : 0);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Saves step `step` from `world` ranks, splitting w and v along `dim` (replicated tensors
  // come from rank 0 only).
  void Save(int64_t step, int world, int dim) {
    const std::string step_dir = StepDir(dir_, step);
    std::vector<std::vector<float>> keep_alive;
    for (int r = 0; r < world; ++r) {
      std::vector<SliceRef> slices;
      for (const char* name : {"w", "v"}) {
        const auto& global = kShapes.at(name);
        std::vector<int64_t> offset(global.size(), 0), shape = global;
        shape[dim] = global[dim] / world;
        offset[dim] = r * shape[dim];
        keep_alive.push_back(Cut(full_[name], global, offset, shape));
        slices.push_back({name, global, offset, shape, keep_alive.back().data()});
      }
      if (r == 0) {
        slices.push_back({"b", {6}, {0}, {6}, full_["b"].data()});
        slices.push_back({"scalar", {}, {}, {}, full_["scalar"].data()});
      }
      ASSERT_TRUE(WriteShard(step_dir, r, slices).ok());
    }
    CheckpointMetadata m;
    m.step = step;
    m.world_size = world;
    m.mesh = {1, world, 1, 1};
    m.job_spec_yaml = "name: test\n";
    m.trainer_json = R"({"data_step": )" + std::to_string(step) + "}";
    Status s = WriteMetadata(step_dir, m);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  void ExpectReads(const CheckpointReader& reader, const std::string& name,
                   const std::vector<int64_t>& offset, const std::vector<int64_t>& shape) {
    const auto& global = kShapes.at(name);
    const std::vector<float> want = Cut(full_[name], global, offset, shape);
    std::vector<float> got(want.size(), -1.0f);
    Status s = reader.ReadSlice(name, offset, shape, got.data());
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(got, want) << name;
  }

  std::string dir_;
  std::map<std::string, std::vector<float>> full_;
};

TEST_F(CheckpointTest, Names) {
  EXPECT_EQ(StepDirName(42), "step-00000042");
  EXPECT_EQ(ShardFileName(3), "rank-00003.safetensors");
  EXPECT_EQ(StepDir("/ck", 7), "/ck/step-00000007");
}

TEST_F(CheckpointTest, RoundTripAndReshardForEverySplit) {
  int64_t step = 1;
  for (int world : {2, 4}) {
    for (int dim : {0, 1}) {
      Save(step, world, dim);
      auto reader = CheckpointReader::Open(StepDir(dir_, step));
      ASSERT_TRUE(reader.ok()) << reader.status().ToString();
      EXPECT_EQ(reader->metadata().world_size, world);
      EXPECT_EQ(reader->metadata().shards.size(), static_cast<size_t>(world));
      // Whole tensors.
      for (const auto& [name, shape] : kShapes) {
        ExpectReads(*reader, name, std::vector<int64_t>(shape.size(), 0), shape);
      }
      // Resharded reads: the other dim split in 2 and 4, and unaligned boxes across shards.
      for (int parts : {2, 3}) {
        const int other = 1 - dim;
        for (int p = 0; p < parts; ++p) {
          std::vector<int64_t> offset = {0, 0}, shape = {8, 12};
          shape[other] = kShapes.at("w")[other] / parts;
          offset[other] = p * shape[other];
          ExpectReads(*reader, "w", offset, shape);
        }
      }
      ExpectReads(*reader, "w", {1, 1}, {6, 4});
      ExpectReads(*reader, "w", {7, 11}, {1, 1});
      ExpectReads(*reader, "w", {3, 2}, {2, 9});
      ExpectReads(*reader, "v", {1, 2, 1}, {3, 3, 1});
      ExpectReads(*reader, "b", {2}, {3});
      ++step;
    }
  }
}

TEST_F(CheckpointTest, MetadataRecordsEverything) {
  Save(12, 2, 0);
  auto m = ReadMetadata(StepDir(dir_, 12));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->format, "meshrun-checkpoint-v1");
  EXPECT_EQ(m->step, 12);
  EXPECT_EQ(m->world_size, 2);
  EXPECT_EQ(m->mesh.dp_shard, 2);
  EXPECT_EQ(m->job_spec_yaml, "name: test\n");
  EXPECT_EQ(m->trainer_json, R"({"data_step":12})");
  EXPECT_EQ(m->tensors, kShapes);
  ASSERT_EQ(m->shards.size(), 2u);
  EXPECT_EQ(m->shards[1].file, "rank-00001.safetensors");
  EXPECT_EQ(m->shards[1].bytes, fs::file_size(StepDir(dir_, 12) + "/rank-00001.safetensors"));
  ASSERT_EQ(m->shards[1].slices.size(), 2u);
  EXPECT_EQ(m->shards[1].slices[0].tensor, "w");
  EXPECT_EQ(m->shards[1].slices[0].offset, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(m->shards[1].slices[0].shape, (std::vector<int64_t>{4, 12}));
  EXPECT_TRUE(CheckComplete(StepDir(dir_, 12)).ok());
}

TEST_F(CheckpointTest, BadRequestsAreErrors) {
  Save(1, 2, 0);
  auto reader = CheckpointReader::Open(StepDir(dir_, 1));
  ASSERT_TRUE(reader.ok());
  std::vector<float> out(100);
  EXPECT_EQ(reader->ReadSlice("nope", {0}, {1}, out.data()).code(), StatusCode::kNotFound);
  EXPECT_EQ(reader->ReadSlice("w", {4, 0}, {5, 6}, out.data()).code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(reader->ReadSlice("w", {0}, {8}, out.data()).ok());        // wrong rank
  EXPECT_TRUE(reader->ReadSlice("w", {0, 0}, {0, 12}, out.data()).ok());  // empty
}

// Offsets near INT64_MAX (from a corrupt metadata.json or a caller) are out of range, not a
// signed overflow that wraps into range (see fuzz/corpus/checkpoint_metadata/regress-*).
TEST_F(CheckpointTest, HugeOffsetsAreOutOfRange) {
  Save(1, 2, 0);
  auto reader = CheckpointReader::Open(StepDir(dir_, 1));
  ASSERT_TRUE(reader.ok());
  std::vector<float> out(100);
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(reader->ReadSlice("w", {max, 0}, {2, 6}, out.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(reader->ReadSlice("w", {0, 1}, {1, max}, out.data()).code(), StatusCode::kOutOfRange);

  std::ifstream in(StepDir(dir_, 1) + "/metadata.json");
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = ParseMetadata(text.str(), "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->step, 1);
  EXPECT_EQ(ParseMetadata("{", "m.json").status().code(), StatusCode::kDataLoss);
  // Numbers that are not integers of the field's type are corrupt, not converted ("3" is the
  // control: the same edit with a valid value parses).
  for (const char* value : {"3", "9.3e19", "2.5", "4294967296", "-1e300"}) {
    const std::string field = "\"world_size\": 2";
    std::string edited = text.str();
    const size_t at = edited.find(field);
    ASSERT_NE(at, std::string::npos);
    edited.replace(at, field.size(), std::string("\"world_size\": ") + value);
    auto m = ParseMetadata(edited, "m.json");
    if (std::string(value) == "3") {
      ASSERT_TRUE(m.ok()) << m.status().message();
      EXPECT_EQ(m->world_size, 3);
    } else {
      EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << value;
    }
  }
}

TEST_F(CheckpointTest, UncoveredTensorIsNotMarkedComplete) {
  const std::string step_dir = StepDir(dir_, 1);
  const std::vector<float> half = Cut(full_["w"], {8, 6}, {0, 0}, {4, 6});
  ASSERT_TRUE(WriteShard(step_dir, 0, {{"w", {8, 6}, {0, 0}, {4, 6}, half.data()}}).ok());
  CheckpointMetadata m;
  m.world_size = 1;
  m.step = 1;
  Status s = WriteMetadata(step_dir, m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("element [4, 0]"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(step_dir + "/metadata.json"));
}

TEST_F(CheckpointTest, WriteShardRejectsBadSlices) {
  const std::vector<float> x(48);
  const std::string step_dir = StepDir(dir_, 1);
  EXPECT_FALSE(WriteShard(step_dir, 0, {{"w", {8, 6}, {6, 0}, {4, 6}, x.data()}}).ok());
  EXPECT_FALSE(WriteShard(step_dir, 0, {{"w", {8, 6}, {0}, {4, 6}, x.data()}}).ok());
  EXPECT_FALSE(
      WriteShard(step_dir, 0,
                 {{"w", {8, 6}, {0, 0}, {4, 6}, x.data()}, {"w", {8, 6}, {0, 0}, {4, 6}, x.data()}})
          .ok());
  CheckpointMetadata m;
  m.step = 1;
  m.world_size = 2;  // rank-00001 was never written
  ASSERT_TRUE(WriteShard(step_dir, 0, {{"b", {6}, {0}, {6}, x.data()}}).ok());
  Status s = WriteMetadata(step_dir, m);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank-00001.safetensors is missing"), std::string::npos);
  m.world_size = 1;
  m.step = 2;  // does not match step-00000001
  EXPECT_FALSE(WriteMetadata(step_dir, m).ok());
  m.step = 1;
  m.trainer_json = "[1]";  // not an object
  EXPECT_FALSE(WriteMetadata(step_dir, m).ok());
  m.trainer_json = "{}";
  EXPECT_TRUE(WriteMetadata(step_dir, m).ok());
}

TEST_F(CheckpointTest, FallsBackFromTruncatedShard) {
  Save(5, 2, 0);
  Save(10, 2, 1);
  const std::string shard = StepDir(dir_, 10) + "/rank-00001.safetensors";
  const uint64_t size = fs::file_size(shard);
  fs::resize_file(shard, 123);
  std::vector<std::string> warnings;
  auto latest = FindLatestComplete(dir_, &warnings);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(latest->step, 5);
  EXPECT_EQ(latest->step_dir, StepDir(dir_, 5));
  EXPECT_EQ(latest->metadata.step, 5);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "checkpoint step-00000010 is incomplete: rank-00001.safetensors has 123 "
            "bytes, expected " +
                std::to_string(size) + "; falling back to step-00000005");
}

TEST_F(CheckpointTest, FallsBackFromMissingShardMetadataAndCorruption) {
  Save(1, 2, 0);
  Save(2, 2, 0);
  Save(3, 4, 1);
  Save(4, 2, 0);
  fs::remove(StepDir(dir_, 4) + "/rank-00000.safetensors");
  fs::remove(StepDir(dir_, 3) + "/metadata.json");
  {
    // Same size, one flipped byte at the end (tensor data): only the CRC tells.
    std::fstream f(StepDir(dir_, 2) + "/rank-00001.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  std::vector<std::string> warnings;
  auto latest = FindLatestComplete(dir_, &warnings);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step, 1);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_NE(warnings[0].find("step-00000004 is incomplete: rank-00000.safetensors is missing"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[1].find("step-00000003 is incomplete: it has no metadata.json"),
            std::string::npos)
      << warnings[1];
  EXPECT_NE(warnings[2].find("step-00000002 is incomplete: rank-00001.safetensors has CRC-32"),
            std::string::npos)
      << warnings[2];
  for (const auto& w : warnings)
    EXPECT_NE(w.find("falling back to step-00000001"), std::string::npos);
}

TEST_F(CheckpointTest, NotFoundWithoutCompleteCheckpoint) {
  std::vector<std::string> warnings;
  EXPECT_EQ(FindLatestComplete(dir_ + "/nothing", &warnings).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(FindLatestComplete(dir_, &warnings).status().code(), StatusCode::kNotFound);
  Save(3, 2, 0);
  fs::remove(StepDir(dir_, 3) + "/metadata.json");
  fs::create_directories(dir_ + "/step-junk");  // not a step folder: ignored
  auto latest = FindLatestComplete(dir_, &warnings);
  EXPECT_EQ(latest.status().code(), StatusCode::kNotFound);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("no complete checkpoint is left"), std::string::npos);
}

TEST_F(CheckpointTest, PruneKeepsTheNewestComplete) {
  for (int64_t step : {1, 2, 3, 4, 5, 6}) Save(step, 2, 0);
  fs::remove(StepDir(dir_, 3) + "/metadata.json");  // a crashed save, older than the newest
  fs::remove(StepDir(dir_, 6) + "/metadata.json");  // newer than the newest complete: kept
  std::vector<std::string> deleted;
  ASSERT_TRUE(PruneCheckpoints(dir_, 2, &deleted).ok());
  EXPECT_EQ(deleted.size(), 3u);  // 3 (incomplete), 2 and 1
  for (int64_t step : {1, 2, 3}) EXPECT_FALSE(fs::exists(StepDir(dir_, step))) << step;
  for (int64_t step : {4, 5, 6}) EXPECT_TRUE(fs::exists(StepDir(dir_, step))) << step;
  ASSERT_TRUE(PruneCheckpoints(dir_, 1).ok());
  EXPECT_FALSE(fs::exists(StepDir(dir_, 4)));
  EXPECT_TRUE(fs::exists(StepDir(dir_, 5)));
  EXPECT_FALSE(PruneCheckpoints(dir_, 0).ok());
  EXPECT_TRUE(PruneCheckpoints(dir_ + "/absent", 2).ok());
}

}  // namespace
}  // namespace meshrun
